"""Stable fingerprints of plans: the same pipeline code and inputs give the same digest in any
process on any machine, so a rerun finds the scatter output of an earlier, interrupted run.

Functions are fingerprinted by what they do (qualified name, bytecode, constants, defaults and
the values their closures capture), not by identity. Changing a function or an argument
changes the digest; re-running the same script does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import types
from typing import Any

__all__ = ["fingerprint"]


def fingerprint(obj: Any) -> str:
    """A hex digest of `obj`'s structure and code."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, obj, depth=0)
    return h.hexdigest()


def _feed(h, obj: Any, depth: int) -> None:
    if depth > 40:
        h.update(b"<deep>")
        return
    d = depth + 1
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(repr((type(obj).__name__, obj)).encode())
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        for item in obj:
            _feed(h, item, d)
        h.update(b")")
    elif isinstance(obj, dict):
        h.update(f"dict[{len(obj)}](".encode())
        for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0])):
            _feed(h, k, d)
            _feed(h, v, d)
        h.update(b")")
    elif isinstance(obj, types.FunctionType):
        _feed_function(h, obj, d)
    elif isinstance(obj, types.CodeType):
        _feed_code(h, obj, d)
    elif isinstance(obj, types.MethodType):
        _feed(h, obj.__func__, d)
        _feed(h, obj.__self__, d)
    elif isinstance(obj, (types.BuiltinFunctionType, type, types.ModuleType)):
        h.update(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}".encode())
    elif dataclasses.is_dataclass(obj):
        h.update(f"{type(obj).__module__}.{type(obj).__qualname__}(".encode())
        for field in dataclasses.fields(obj):
            h.update(field.name.encode())
            _feed(h, getattr(obj, field.name), d)
        h.update(b")")
    else:
        try:
            h.update(pickle.dumps(obj, protocol=5))
        except Exception:
            h.update(f"{type(obj).__module__}.{type(obj).__qualname__}".encode())


def _feed_function(h, fn: types.FunctionType, depth: int) -> None:
    h.update(f"fn:{fn.__module__}.{fn.__qualname__}".encode())
    _feed_code(h, fn.__code__, depth)
    _feed(h, fn.__defaults__, depth)
    _feed(h, fn.__kwdefaults__, depth)
    for cell in fn.__closure__ or ():
        try:
            _feed(h, cell.cell_contents, depth)
        except ValueError:  # empty cell
            h.update(b"<empty>")


def _feed_code(h, code: types.CodeType, depth: int) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(h, const, depth + 1)
        else:
            _feed(h, const, depth + 1)
