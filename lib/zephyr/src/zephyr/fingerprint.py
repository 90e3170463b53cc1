"""Stable fingerprints of plans: the same pipeline code and inputs give the same digest in any
process on any machine, so a rerun finds the scatter output of an earlier, interrupted run,
and a changed pipeline does not.

Functions are fingerprinted by what they do: qualified name, bytecode, constants, defaults,
the values their closures capture, and the module-level functions and constants they refer to
(followed recursively, e.g. a helper called by a lambda, or a threshold it reads). Modules and
classes count by name. Sets are hashed as sorted elements, so digests do not depend on
PYTHONHASHSEED. Each object is visited once, so mutually recursive helpers terminate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import types
from typing import Any

__all__ = ["fingerprint"]

_MAX_DEPTH = 60


def fingerprint(obj: Any) -> str:
    """A hex digest of `obj`'s structure and code."""
    h = hashlib.blake2b(digest_size=16)
    _Feeder(h).feed(obj, 0)
    return h.hexdigest()


class _Feeder:
    def __init__(self, h):
        self.h = h
        self.seen: dict[int, int] = {}  # id -> order of first visit (back-references hash by it)
        self.keep: list[Any] = []  # keeps visited objects alive so ids stay unique

    def feed(self, obj: Any, depth: int) -> None:
        h = self.h
        if obj is None or isinstance(obj, (bool, int, float, str, bytes, complex)):
            h.update(repr((type(obj).__name__, obj)).encode())
            return
        if depth > _MAX_DEPTH:
            h.update(b"<deep>")
            return
        if id(obj) in self.seen:
            h.update(f"<ref {self.seen[id(obj)]}>".encode())
            return
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        d = depth + 1
        if isinstance(obj, (list, tuple)):
            h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
            for item in obj:
                self.feed(item, d)
            h.update(b")")
        elif isinstance(obj, (set, frozenset)):
            h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
            for digest in sorted(fingerprint(item) for item in obj):
                h.update(digest.encode())
            h.update(b")")
        elif isinstance(obj, dict):
            h.update(f"dict[{len(obj)}](".encode())
            for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0])):
                self.feed(k, d)
                self.feed(v, d)
            h.update(b")")
        elif isinstance(obj, types.FunctionType):
            self._function(obj, d)
        elif isinstance(obj, types.CodeType):
            self._code(obj, d)
        elif isinstance(obj, types.MethodType):
            self.feed(obj.__func__, d)
            self.feed(obj.__self__, d)
        elif isinstance(obj, (types.BuiltinFunctionType, type, types.ModuleType)):
            h.update(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}".encode())
        elif dataclasses.is_dataclass(obj):
            h.update(f"{type(obj).__module__}.{type(obj).__qualname__}(".encode())
            for field in dataclasses.fields(obj):
                h.update(field.name.encode())
                self.feed(getattr(obj, field.name), d)
            h.update(b")")
        else:
            try:
                h.update(pickle.dumps(obj, protocol=5))
            except Exception:
                h.update(f"{type(obj).__module__}.{type(obj).__qualname__}".encode())

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        self.h.update(f"fn:{fn.__module__}.{fn.__qualname__}".encode())
        self._code(fn.__code__, depth)
        self.feed(fn.__defaults__, depth)
        self.feed(fn.__kwdefaults__, depth)
        for cell in fn.__closure__ or ():
            try:
                self.feed(cell.cell_contents, depth)
            except ValueError:  # an empty cell
                self.h.update(b"<empty>")
        # module-level names the code reads: helpers and constants count, modules by name
        fn_globals = fn.__globals__
        for name in sorted(_global_names(fn.__code__)):
            if name in fn_globals:
                self.h.update(f"global:{name}".encode())
                self.feed(fn_globals[name], depth)

    def _code(self, code: types.CodeType, depth: int) -> None:
        self.h.update(code.co_code)
        self.h.update(repr(code.co_names).encode())
        for const in code.co_consts:
            self.feed(const, depth + 1)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
