"""Stable fingerprints of plans: what identifies a stage's work, so a rerun resumes the scatter
output of an earlier, interrupted run of the same work and never reuses work made otherwise.

Identity covers everything that decides what a stage computes, walked structurally:
- values: None, bools, numbers, strings and bytes by type and value; lists, tuples and dicts
  in order (dicts in insertion order); sets and frozensets as their elements' sorted digests
  (never in hash order, so PYTHONHASHSEED does not matter); NumPy arrays by dtype, shape and
  bytes; enum members by class, name and value;
- functions by qualified name, bytecode, names, constants, defaults, keyword defaults, the
  values their closures capture, and the module-level names their code reads (helpers and
  constants, followed recursively: e.g. a helper called by a lambda, or a threshold it reads).
  Functions of the user's own modules (and of a `__main__` without a file: `python -c`,
  notebooks) count by their code although they pickle by reference; those of the standard
  library, installed packages and zephyr count by name (by code too where their name is not
  unique: lambdas and nested functions). A user module the code reaches into (`mod.helper`,
  `mod.FACTOR`, a module held in a class attribute, a container or a default: `Cfg.mod.helper`)
  counts by its attributes of the names the code being walked reads; library modules by name;
  a module imported inside the function by name and source (below), loaded yet or not;
- the code all that can reach, beyond the names it spells (`getattr(mod, "f")`,
  `globals()[...]`, `importlib.import_module("mod")`): the walk notes the modules it met, and
  `code_reach.code_lines` adds the source digests of those user modules and of every user
  module they import, and the identity of each library met (`code_origin`: Python's version,
  zephyr's, an installed distribution's name, version and RECORD);
- bound methods by function and instance; `staticmethod`, `classmethod`, `property`,
  `cached_property` by their functions; `lru_cache` wrappers by the function they wrap;
  builtins by name (and the object a builtin method is bound to);
- classes of the standard library, installed packages and zephyr by name (unless made by a
  factory: `<locals>` in the name); other classes by name, bases, methods (a changed `__call__` body counts) and class attributes;
- any other object (callable objects, dataclasses, `functools.partial`, ...) as what
  `__reduce_ex__` (or copyreg's table, as pickle does) says rebuilds it: the constructor, its arguments and the state (instance
  `__dict__` and `__slots__`), each walked the same way, never pickled.

Each mutable object or function is walked once (later visits hash a back-reference by
order of first visit), so cycles and mutually recursive helpers terminate. Nothing depends
on hash seeds, set order, `id()` or memory addresses, so the digest is the same in every
process.

Some objects have no identity that can be established: ones `__reduce_ex__` refuses (locks,
open files, sockets, generators, C objects without pickling support), ones whose walk
raises, structures nested deeper than 100 levels, and code whose reach its source does not
tell (a computed import: `code_reach`). Then `identify` returns an `Identity` that is not resumable: its
digest includes a random nonce, so it never equals another (the run works, it just cannot
resume), and `reason` says what was found where, e.g.
"map(fn) -> function fn closure cell 'client': a _thread.lock (cannot be reduced: ...)".
"""

from __future__ import annotations

import copyreg
import dis
import enum
import functools
import hashlib
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

from zephyr.plan.code_origin import is_library as _is_library
from zephyr.plan.code_reach import Reach, code_lines

__all__ = ["Identity", "fingerprint", "identify"]

_MAX_DEPTH = 100
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
# class attributes that say nothing about behaviour (or repeat what the walk sees elsewhere)
_SKIPPED_CLASS_ATTRS = frozenset({
    "__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__", "__slots__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__orig_bases__", "__parameters__",
    "__abstractmethods__", "_abc_impl", "__static_attributes__", "__firstlineno__", "__annotate__",
})


@dataclass(frozen=True)
class Identity:
    """A digest of some work's code and data; `reason` is non-empty when it could not be
    established (the digest is then unique to this call, so nothing ever resumes from it)."""

    digest: str
    reason: str = ""

    @property
    def resumable(self) -> bool:
        return not self.reason


def identify(*parts: tuple[str, Any], after: Identity | None = None) -> Identity:
    """The identity of labelled `parts` (the labels name where a problem was found), chained
    onto `after` (an earlier stage's identity, whose reason carries over)."""
    h = hashlib.blake2b(digest_size=16)
    if after is not None:
        h.update(f"after:{after.digest}".encode())
    h.update(f"parts[{len(parts)}]".encode())
    reason = after.reason if after is not None else ""
    feeder = _Feeder(h, Reach())
    try:
        for label, obj in parts:
            feeder.reach.part = label
            feeder.feed_at(label, obj, 0)
    except _Unidentifiable as e:
        reason = reason or e.describe()
    try:
        lines, unknown = code_lines(feeder.reach)
    except Exception as e:  # noqa: BLE001 - code we cannot read has no identity we trust
        lines, unknown = [], f"the code it reaches could not be read ({type(e).__name__}: {e})"
    h.update(f"code[{len(lines)}]".encode())
    for line in lines:
        h.update(f"{line};".encode())
    reason = reason or unknown
    if reason:
        h.update(b"nonce:" + os.urandom(16))
    return Identity(h.hexdigest(), reason)


def fingerprint(obj: Any) -> str:
    """A hex digest of `obj`'s structure and code (unique per call if it has no identity)."""
    return identify(("", obj)).digest


class _Unidentifiable(Exception):
    """An object with no identity; `where` collects labels as it propagates outwards."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what
        self.where: list[str] = []

    def describe(self) -> str:
        labels = [label for label in reversed(self.where) if label]
        if len(labels) > 8:  # a deep structure: its start and where it ended
            labels = labels[:4] + [f"... ({len(labels) - 8} more)"] + labels[-4:]
        where = " -> ".join(labels)
        return f"{where}: {self.what}" if where else self.what


class _Feeder:
    def __init__(self, h, reach: Reach):
        self.h = h
        self.reach = reach  # the modules whose code the walk met (`code_reach`)
        self.seen: dict[int, int] = {}  # id -> order of first visit (back-references hash by it)
        self.keep: list[Any] = []  # keeps visited objects alive so ids stay unique
        self.fed: set[tuple[int, str]] = set()  # (user module, attribute) pairs fed (modules live on)
        self.reading: list[set[str]] = []  # the names read by the functions being walked

    def feed_at(self, label: Any, obj: Any, depth: int) -> None:
        """`feed`, naming `label` (a str, or a callable making one) in a problem's path."""
        try:
            self.feed(obj, depth)
        except _Unidentifiable as e:
            e.where.append(label() if callable(label) else label)
            raise
        except RecursionError:
            raise _Unidentifiable("nested too deeply for Python's recursion limit") from None
        except Exception as e:  # noqa: BLE001 - an object that breaks the walk has no identity we trust
            raise _Unidentifiable(f"a {_type_name(obj)} that could not be walked ({type(e).__name__}: {e})") from None

    def feed(self, obj: Any, depth: int) -> None:
        h = self.h
        kind = type(obj)
        if kind in _ATOMS:
            h.update(f"{kind.__name__}:{obj!r};".encode())
            return
        if depth > _MAX_DEPTH:
            raise _Unidentifiable(f"nested deeper than {_MAX_DEPTH} levels")
        d = depth + 1
        if kind is tuple:  # immutable: no back-reference (sharing may differ between processes)
            self._items(obj, d)
            return
        if kind is frozenset:
            self._set(obj, d)
            return
        if kind is types.CodeType:
            self._code(obj, d)
            return
        if id(obj) in self.seen:
            h.update(f"<ref {self.seen[id(obj)]}>".encode())
            if kind is types.ModuleType and self.reading:  # seen before, maybe by code reading other names
                self._user_module(obj, set().union(*self.reading), d)
            return
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        self._compound(obj, kind, d)

    def _compound(self, obj: Any, kind: type, d: int) -> None:
        h = self.h
        if kind is list:
            self._items(obj, d)
        elif kind is set:
            self._set(obj, d)
        elif kind is dict or kind is types.MappingProxyType:
            self._dict(obj, d)
        elif kind is bytearray:
            h.update(b"bytearray:" + bytes(obj))
        elif kind is types.FunctionType:
            self._function(obj, d)
        elif kind is types.MethodType:
            h.update(b"method(")
            self.feed_at("function", obj.__func__, d)
            self.feed_at("bound to", obj.__self__, d)
            h.update(b")")
        elif kind in (staticmethod, classmethod):
            h.update(f"{kind.__name__}(".encode())
            self.feed(obj.__func__, d)
            h.update(b")")
        elif kind is functools.cached_property:
            h.update(b"cached_property(")
            self.feed(obj.func, d)
            h.update(b")")
        elif kind is property:
            h.update(b"property(")
            for part in ("fget", "fset", "fdel"):
                self.feed_at(part, getattr(obj, part), d)
            h.update(b")")
        elif kind in _BUILTIN_CALLABLES:
            self._builtin(obj, d)
        elif isinstance(obj, type):
            self._class(obj, d)
        elif kind is types.ModuleType:  # reached through a class attribute, a container, ...
            h.update(f"module:{obj.__name__};".encode())
            self.reach.namespace(vars(obj))
            if self.reading:
                self._user_module(obj, set().union(*self.reading), d)
        elif isinstance(obj, enum.Enum):
            h.update(b"enum(")
            self.feed(kind, d)
            h.update(f"{obj.name};".encode())
            self.feed_at(lambda: f"value of {kind.__qualname__}.{obj.name}", obj.value, d)
            h.update(b")")
        elif _is_ndarray(obj):
            self._ndarray(obj, d)
        else:
            self._reduced(obj, kind, d)

    def _items(self, obj: list | tuple, d: int) -> None:
        h = self.h
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        for i, item in enumerate(obj):
            kind = type(item)
            if kind in _ATOMS:  # inline: from_list sources hold many records
                h.update(f"{kind.__name__}:{item!r};".encode())
            else:
                self.feed_at(lambda i=i: f"item {i}", item, d)
        h.update(b")")

    def _set(self, obj: Any, d: int) -> None:
        """Elements by their own digests, sorted: the same whatever the hash order."""
        digests = []
        for item in obj:
            sub = _Feeder(hashlib.blake2b(digest_size=16), self.reach)
            sub.reading = self.reading
            sub.feed_at(lambda: f"set element {_short_repr(item)}", item, d)
            digests.append(sub.h.hexdigest())
        self.h.update(f"{type(obj).__name__}[{len(obj)}]({','.join(sorted(digests))})".encode())

    def _dict(self, obj: Any, d: int) -> None:
        h = self.h
        h.update(f"dict[{len(obj)}](".encode())
        for k, v in obj.items():  # insertion order: deterministic, and iteration order matters
            kind, vkind = type(k), type(v)
            if kind in _ATOMS and vkind in _ATOMS:  # inline: from_list sources hold many records
                h.update(f"{kind.__name__}:{k!r};{vkind.__name__}:{v!r};".encode())
                continue
            self.feed_at(lambda k=k: f"key {_short_repr(k)}", k, d)
            self.feed_at(lambda k=k: f"[{_short_repr(k)}]", v, d)
        h.update(b")")

    def _function(self, fn: types.FunctionType, d: int) -> None:
        h = self.h
        name = f"{fn.__module__}.{fn.__qualname__}"
        h.update(f"fn:{name}(".encode())
        home = fn.__globals__.get("__name__", fn.__module__)  # where its code is (`functools.wraps` copies __module__)
        if _is_library(home) and "<" not in fn.__qualname__:
            self.reach.library(home)  # a library function with a unique name: its name and its library's identity
            h.update(b")")
            return
        self._code(fn.__code__, d)
        names = _global_names(fn.__code__)
        self.reach.function(fn, names)
        self.reading.append(names)  # a user module met below counts by these names (`_user_module`)
        try:
            self.feed_at("defaults", fn.__defaults__, d)
            self.feed_at("keyword defaults", fn.__kwdefaults__, d)
            if fn.__dict__:  # attributes set on the function (functools.wraps: __wrapped__)
                self.feed_at("attributes", fn.__dict__, d)
            self._function_refs(fn, names, d)
        finally:
            self.reading.pop()
        h.update(b")")

    def _function_refs(self, fn: types.FunctionType, names: set[str], d: int) -> None:
        """What `fn` refers to: closure cells, the module-level names its code reads, and the
        user modules among them or imported inside it (`_user_module`)."""
        h = self.h
        modules = []  # modules the code reads attributes of: a user module's count (`_user_module`)
        for name_, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                h.update(b"<empty>")
                continue
            self.feed_at(lambda n=name_: f"{_fn_label(fn)} closure cell {n!r}", value, d)
            if type(value) is types.ModuleType:
                modules.append(value)
        # module-level names the code reads: helpers and constants count, modules by name
        fn_globals = fn.__globals__
        for name_ in sorted(names):
            if name_ in fn_globals:
                h.update(f"global:{name_};".encode())
                value = fn_globals[name_]
                self.feed_at(lambda n=name_: f"{_fn_label(fn)} global {n!r}", value, d)
                if type(value) is types.ModuleType:
                    modules.append(value)
        for name_ in sorted(_imported_names(fn.__code__)):  # `import mod` inside the function: by its source
            h.update(f"imports:{name_};".encode())  # (`code_reach`), imported yet or not
            self.reach.imported(name_)
        for module in modules:
            self._user_module(module, names, d)

    def _user_module(self, module: types.ModuleType, names: set[str], d: int) -> None:
        """What the code reaches in a module of the user's own (`mod.helper(...)`, `mod.FACTOR`,
        `Cfg.mod.helper(...)`): the module's attributes of the
        names the code being walked reads (helpers followed as any function; a submodule the
        same way), each (module, name) once. Library modules count by name (above); the module's
        source and what it imports count too (`code_reach`)."""
        self.reach.namespace(vars(module))
        if _is_library(module.__name__):
            return
        attributes = vars(module)
        for name in sorted(names):
            if (id(module), name) in self.fed or name not in attributes or (name[:2] == "__" and name[-2:] == "__"):
                continue
            self.fed.add((id(module), name))
            value = attributes[name]
            self.h.update(f"module:{module.__name__}.{name};".encode())
            self.feed_at(lambda n=name: f"reads {module.__name__}.{n}", value, d)
            if type(value) is types.ModuleType:
                self._user_module(value, names, d)

    def _code(self, code: types.CodeType, d: int) -> None:
        h = self.h
        h.update(f"code:{code.co_name}:{code.co_argcount}:{code.co_posonlyargcount}:{code.co_kwonlyargcount}:{code.co_flags}:".encode())
        h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
        h.update(code.co_code)
        h.update(getattr(code, "co_exceptiontable", b""))  # which instructions each handler covers
        for const in code.co_consts:
            self.feed(const, d)

    def _builtin(self, obj: Any, d: int) -> None:
        """C functions and method descriptors by name; a bound one with what it is bound to."""
        owner = getattr(obj, "__objclass__", None)
        prefix = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else getattr(obj, "__module__", None)
        self.h.update(f"builtin:{prefix}.{getattr(obj, '__qualname__', obj.__name__)}(".encode())
        module = getattr(obj, "__module__", None)
        module = module if isinstance(module, str) else getattr(owner, "__module__", None)
        if isinstance(module, str):
            self.reach.module_named(module)  # a library's (or a user's compiled module's) C code
        bound = getattr(obj, "__self__", None)
        if bound is not None and not isinstance(bound, types.ModuleType):
            self.feed_at("bound to", bound, d)
        self.h.update(b")")

    def _class(self, cls: type, d: int) -> None:
        h = self.h
        h.update(f"class:{cls.__module__}.{cls.__qualname__}(".encode())
        self.reach.module_named(cls.__module__)
        if not _is_library(cls.__module__) or "<" in cls.__qualname__:  # made by a factory: not unique by name
            for base in cls.__bases__:
                self.feed_at(lambda b=base: f"base {b.__qualname__}", base, d)
            for name, value in vars(cls).items():
                if name in _SKIPPED_CLASS_ATTRS or (name[:1] == "_" and name[-1:] == "_" and name[:2] != "__"):
                    continue
                h.update(f"attr:{name};".encode())
                self.feed_at(lambda n=name: f"class {cls.__qualname__} attribute {n!r}", value, d)
        h.update(b")")

    def _ndarray(self, arr: Any, d: int) -> None:
        self.h.update(f"ndarray:{arr.dtype.str}:{arr.shape}:".encode())
        if arr.dtype.hasobject:
            self.feed_at("array items", arr.tolist(), d)
        else:
            self.h.update(arr.tobytes())

    def _reduced(self, obj: Any, kind: type, d: int) -> None:
        """What `__reduce_ex__` says rebuilds `obj`: constructor, arguments, state, items."""
        h = self.h
        try:  # as pickle does: copyreg's table first (re.Pattern is reduced there)
            reducer = copyreg.dispatch_table.get(kind)
            reduced = reducer(obj) if reducer is not None else obj.__reduce_ex__(4)
        except Exception as e:  # noqa: BLE001 - any refusal means: no inspectable state
            raise _Unidentifiable(f"a {_type_name(obj)} (cannot be reduced: {type(e).__name__}: {e})") from None
        h.update(b"reduced(")
        self.feed_at("type", kind, d)
        if isinstance(reduced, str):  # a global, pickled by reference (an lru_cache'd function: by what it wraps)
            h.update(f"global:{reduced};".encode())
            wrapped = getattr(obj, "__wrapped__", None)
            if wrapped is not None:
                self.feed_at("wrapped function", wrapped, d)
        else:
            labels = ("constructor", "arguments", "state", "list items", "dict items", "state setter")
            for label, part in zip(labels, reduced):
                if label in ("list items", "dict items") and part is not None:
                    part = list(part)
                self.feed_at(lambda lb=label: f"{kind.__qualname__} {lb}", part, d)
        h.update(b")")


_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType,
    types.ClassMethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType,
)


@functools.lru_cache(maxsize=4096)  # code objects are immutable; walking their bytecode is most of a walk's time
def _global_names(code: types.CodeType) -> frozenset[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return frozenset(names)


@functools.lru_cache(maxsize=4096)  # code objects are immutable; walking their bytecode is most of a walk's time
def _imported_names(code: types.CodeType) -> frozenset[str]:
    """The modules `code` (or code nested in it) imports by absolute name."""
    names = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME" and isinstance(instruction.argval, str):
            names.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _imported_names(const)
    return frozenset(names)


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _fn_label(fn: types.FunctionType) -> str:
    return f"function {fn.__qualname__}"


def _short_repr(value: Any) -> str:
    text = repr(value) if type(value) in _ATOMS else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _is_ndarray(obj: Any) -> bool:
    kind = type(obj)
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy"
