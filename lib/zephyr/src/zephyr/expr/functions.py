"""What the expression methods of one value mean (`col("text").str_lower()`, `.cast("int")`, ...).

Each function is defined by Python, on the value a record holds; this module is that definition
(`zephyr.engine.translate` computes it in Polars only where Polars provably agrees). For every
function a null value gives null. A value of a kind the function does not take is a TypeError
naming the expression and the value; a value the function cannot convert (`cast("int")` of
"3.5") is a ValueError naming both.

- strings: `str_contains(s)` (substring), `str_matches(pattern)` (`re.search` finds a match),
  `str_starts_with(s)`, `str_ends_with(s)`, `str_lower()`, `str_upper()` (`str.lower`/`upper`:
  full Unicode mappings, "ß" upper is "SS"), `str_strip()` (`str.strip()`: whitespace as
  `str.isspace` says), `word_count()` (`len(s.split())`: maximal runs of non-whitespace);
- `list_len()`: the length of a list (a tuple counts too);
- `is_in(values)`: whether the value `==` one of `values`, literals of one kind (str, int, float
  or bool; no null, no NaN), as `col(x) == v` says: 1.0 and True are in [1], "1" is not;
- `cast(kind)`: "str" is `str(v)` of a str, int, float or bool ("True", "1e-07"); "int" is
  `int(v)` of an int, bool, float (toward zero) or str (Python's parsing: " 42 ", "1_000");
  "float" is `float(v)` of a float, int, bool or str ("nan", "1e5"); "bool" is `bool(v)` of a
  bool, int or float (a string is refused: `bool("false")` is true; compare it instead);
- `hash()`: xxHash64 (seed 0) of the value's canonical bytes (`zephyr.canonical.key_bytes`, the
  shuffle's key encoding), an int in [0, 2**64): the same in every process, on every machine and
  with any Polars version; `1`, `1.0` and `True` hash differently, as they are different keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import xxhash

from zephyr.canonical import key_bytes

__all__ = ["CAST_KINDS", "FUNCTIONS", "checked_arguments", "kind_of", "prepared"]

CAST_KINDS = ("str", "int", "float", "bool")
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}


def kind_of(value: Any) -> str:
    """The kind of a value as the functions take it: "bool", "int", "float", "str", "list", or its type's name."""
    for kind, name in _SCALARS.items():  # bool before int: True is an int to isinstance
        if isinstance(value, kind):
            return name
    return "list" if isinstance(value, (list, tuple)) else type(value).__name__


def _refused(node: Any, needs: str, value: Any) -> TypeError:
    return TypeError(f"{node!r} needs {needs}, got {type(value).__name__} {value!r:.80}")


def _string(apply: Callable[..., Any]) -> Callable[..., Any]:
    def call(value: Any, node: Any, *args: Any) -> Any:
        if not isinstance(value, str):
            raise _refused(node, "a string", value)
        return apply(value, *args)
    return call


def _list_len(value: Any, node: Any) -> int:
    if not isinstance(value, (list, tuple)):
        raise _refused(node, "a list", value)
    return len(value)


def _hash(value: Any, node: Any) -> int:
    return xxhash.xxh64_intdigest(key_bytes(value))


def _is_in(value: Any, node: Any, values: tuple, members: frozenset) -> bool:
    try:
        return value in members  # hashing and `==`: 1 == 1.0 == True, as `col(x) == 1` says
    except TypeError:  # an unhashable value (a list, a dict) equals no scalar
        return False


_CONVERT = {"str": str, "int": int, "float": float, "bool": bool}
_CAST_TAKES = {"str": ("str", "int", "float", "bool"), "int": ("int", "bool", "float", "str"),
               "float": ("float", "int", "bool", "str"), "bool": ("bool", "int", "float")}


def _cast(value: Any, node: Any, kind: str) -> Any:
    if kind_of(value) not in _CAST_TAKES[kind]:
        hint = " (compare it instead, e.g. == 'true')" if kind == "bool" and isinstance(value, str) else ""
        raise _refused(node, f"one of {', '.join(_CAST_TAKES[kind])}{hint}", value)
    try:
        return _CONVERT[kind](value)
    except (ValueError, OverflowError) as e:  # int("3.5"), int(nan), float(10**400)
        raise ValueError(f"{node!r} cannot convert {type(value).__name__} {value!r:.80}: {e}") from None


# name -> (Python meaning: (value, node, *arguments) -> result, the kind of its result)
FUNCTIONS: dict[str, tuple[Callable[..., Any], str | None]] = {
    "str_contains": (_string(lambda s, sub: sub in s), "bool"),
    "str_matches": (_string(lambda s, pattern, compiled: compiled.search(s) is not None), "bool"),
    "str_starts_with": (_string(str.startswith), "bool"),
    "str_ends_with": (_string(str.endswith), "bool"),
    "str_lower": (_string(str.lower), "str"),
    "str_upper": (_string(str.upper), "str"),
    "str_strip": (_string(str.strip), "str"),
    "word_count": (_string(lambda s: len(s.split())), "int"),
    "list_len": (_list_len, "int"),
    "hash": (_hash, "uint64"),
    "is_in": (_is_in, "bool"),
    "cast": (_cast, None),
}


def checked_arguments(name: str, args: tuple) -> tuple:
    """The function's arguments as the node keeps them (what its text shows), checked; a
    bad argument is a TypeError or ValueError here, when the expression is built."""
    if name not in FUNCTIONS:
        raise ValueError(f"unknown expression function {name!r}; known: {', '.join(sorted(FUNCTIONS))}")
    if name in ("str_contains", "str_starts_with", "str_ends_with", "str_matches"):
        if len(args) != 1 or not isinstance(args[0], str):
            raise TypeError(f"{name}() takes one string, got {args!r:.80}")
        if name == "str_matches":
            try:
                re.compile(args[0])
            except re.error as e:
                raise ValueError(f"str_matches({args[0]!r}): not a regular expression: {e}") from None
        return args
    if name == "is_in":
        return (_is_in_values(args),)
    if name == "cast":
        if len(args) != 1 or args[0] not in CAST_KINDS:
            raise ValueError(f"cast() takes one of {', '.join(map(repr, CAST_KINDS))}, got {args!r:.80}")
        return args
    if args:
        raise TypeError(f"{name}() takes no arguments, got {args!r:.80}")
    return args


def _is_in_values(args: tuple) -> tuple:
    """`is_in`'s literals as a tuple (a set's sorted, so the text is the same in every process)."""
    if len(args) != 1 or not isinstance(args[0], (list, tuple, set, frozenset)):
        raise TypeError(f"is_in() takes a list, tuple or set of literals, got {args!r:.80}")
    values = args[0]
    kinds = {kind_of(v) for v in values}
    if len(kinds) > 1 or not kinds <= set(CAST_KINDS):
        raise TypeError(f"is_in() takes literals of one kind (str, int, float or bool), got {sorted(kinds)} in {values!r:.80}")
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        raise ValueError(f"is_in() cannot hold NaN (it equals nothing, itself included): {values!r:.80}")
    return tuple(sorted(values)) if isinstance(values, (set, frozenset)) else tuple(values)


def prepared(name: str, args: tuple) -> tuple:
    """The arguments the function is called with (a compiled pattern, a set to look up in)."""
    if name == "str_matches":
        return (args[0], re.compile(args[0]))
    if name == "is_in":
        return (args[0], frozenset(args[0]))
    return args
