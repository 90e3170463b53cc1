"""Which regular expressions Polars reads as Python's `re.search` does.

`str_matches(pattern)` means `re.search(pattern, s) is not None`. Polars matches with Rust's
`regex` crate, which differs from `re`: it has no lookaround or backreferences, `$` is the very
end (Python's also matches before a final newline), `\\d \\w \\s \\b` and case folding follow its
own Unicode tables (Python's are another Unicode version), `[` inside a class nests and `&&`,
`--`, `~~` are set operations, escapes like `\\u`, `\\x`, `\\Z` read otherwise, `{` that starts no
repetition is an error. Whether a string holds a match does not depend on how an engine
searches (backtracking or automaton), only on the language the pattern describes, so a pattern
built only from parts both read alike matches the same strings in both. Those parts:

- any character but `\\ . ^ $ * + ? { } [ ] ( ) |`, standing for itself;
- `\\` before one of `\\ . + * ? ( ) | [ ] { } ^ $ # & - ~` (that character) or `n t r f v`;
- `.` (any character but a newline), `^` (the start; not repeated);
- `[...]` and `[^...]` of such characters (and `\\]`, `\\[`, `\\^`, `\\-` escaped) and ranges `a-z`,
  with `-` literal only first or last; no `[` inside, no `&&`, `~~`;
- groups `(...)`, `(?:...)`, alternation `|`;
- repetition `* + ?` and `{n}`, `{n,}`, `{n,m}` (at most 1000), each optionally lazy (`?`).

Anything else runs in Python (that block's records). Polars must also compile the pattern
(its size limit), checked once per pattern.
"""

from __future__ import annotations

import functools

import polars as pl

__all__ = ["polars_reads_alike"]

_META = set("\\.^$*+?{}[]()|")
_ESCAPABLE = set("\\.+*?()|[]{}^$#&-~") | set("ntrfv")
_MAX_REPEAT = 1000


class _Unlike(Exception):
    pass


@functools.lru_cache(maxsize=256)
def polars_reads_alike(pattern: str) -> bool:
    """Whether Polars' `str.contains(pattern)` is true exactly where `re.search` finds a match."""
    try:
        end = _alternation(pattern, 0)
        if end != len(pattern):
            raise _Unlike
        pl.Series([""], dtype=pl.String).str.contains(pattern)  # compiles within Rust's limits
    except (_Unlike, pl.exceptions.PolarsError):
        return False
    return True


def _alternation(p: str, i: int) -> int:
    i = _sequence(p, i)
    while i < len(p) and p[i] == "|":
        i = _sequence(p, i + 1)
    return i


def _sequence(p: str, i: int) -> int:
    while i < len(p) and p[i] not in "|)":
        if p[i] == "^":
            i += 1
            if i < len(p) and p[i] in "*+?{":
                raise _Unlike  # a repeated anchor
            continue
        i = _repetition(p, _atom(p, i))
    return i


def _atom(p: str, i: int) -> int:
    c = p[i]
    if c == "(":
        i += 3 if p.startswith("(?:", i) else 1
        if i < len(p) and p[i] == "?":
            raise _Unlike  # flags, lookaround, named groups, comments
        i = _alternation(p, i)
        if i >= len(p) or p[i] != ")":
            raise _Unlike
        return i + 1
    if c == "[":
        return _class(p, i + 1)
    if c == "\\":
        return _escape(p, i)
    if c in _META and c != ".":
        raise _Unlike  # `$`, a stray `{ } ]`, a repetition of nothing
    return i + 1


def _escape(p: str, i: int) -> int:
    if i + 1 >= len(p) or p[i + 1] not in _ESCAPABLE:
        raise _Unlike
    return i + 2


def _repetition(p: str, i: int) -> int:
    if i >= len(p) or p[i] not in "*+?{":
        return i
    if p[i] == "{":
        close = p.find("}", i)
        low, comma, high = p[i + 1 : close].partition(",") if close > 0 else ("", "", "")
        if not low.isascii() or not low.isdigit() or (high and not (high.isascii() and high.isdigit())):
            raise _Unlike
        if int(low) > _MAX_REPEAT or (high and not int(low) <= int(high) <= _MAX_REPEAT):
            raise _Unlike
        i = close + 1
    else:
        i += 1
    if i < len(p) and p[i] == "?":
        i += 1  # lazy
    if i < len(p) and p[i] in "*+?{":
        raise _Unlike  # possessive (`a*+`) or a repeated repetition
    return i


def _class(p: str, i: int) -> int:
    """The end of a class whose opening `[` is before `i`."""
    if i < len(p) and p[i] == "^":
        i += 1
    start = i
    while i < len(p) and p[i] != "]":
        c = p[i]
        if c == "[" or p.startswith(("&&", "~~", "--"), i):
            raise _Unlike
        if c == "-" and i != start and i + 1 < len(p) and p[i + 1] != "]":
            raise _Unlike  # a `-` that is not first or last belongs to a range
        i = _escape(p, i) if c == "\\" else i + 1
        if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":
            if p[i + 1] in "[]-":
                raise _Unlike
            i = _escape(p, i + 1) if p[i + 1] == "\\" else i + 2
    if i == start or i >= len(p):
        raise _Unlike  # `[]...` or no closing bracket
    return i + 1
