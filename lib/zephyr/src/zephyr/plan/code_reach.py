"""The code a stage can reach, module by module: identity for what a walk by names cannot see.

`fingerprint` walks a stage's functions by the names their code spells. Code reaches more:
`getattr(mylib, "scale")`, `globals()[name]`, `importlib.import_module("mylib")`, a helper's
helper in a module nobody names. So the walk also notes, in a `Reach`, the modules whose code it
met: the user's modules of the functions and classes it walked ("homes"), the modules it met as
values, and the library modules it met. `code_lines` takes the closure of those user modules
under their imports (every `import` and `from ... import` anywhere in the file, a literal
`importlib.import_module("x")`, `__import__("x")` or `sys.modules["x"]`, a dotted string naming
a user module (a lazy-import table), and the packages above each module) and gives a line for each:
- a user module: its source file's digest (any edit counts, even one the stage never runs),
  except a home reached only through the functions the walk followed (their code is fingerprinted
  already), so another stage's function in the same script is not part of this stage's identity;
- a library module: `code_origin.library_identity` (Python's version, zephyr's, or the
  installed distribution's name, version and RECORD hashes);
- an import that finds no module: missing (installing it later is a change).

Where what the code reaches cannot be told, `code_lines` says why and the stage is not
resumable: a computed import (`importlib.import_module(name)`, `__import__(name)`,
`sys.modules[name]`), code run from a computed string (`exec`, `eval`) or loaded from a file
path (`runpy.run_path`, `spec_from_file_location`) in a module whose every function may run (one
met as a value or through an import), or in the walked functions of a home; a user module whose
file cannot be read; a library module no distribution or file tells; code without a source file
(`python -c`, a notebook) that calls any of those or `globals()`. A line marked
`# zephyr: names listed` vouches that what it imports is named as literals elsewhere in the
reached code (the lazy-import table of a package facade), so it does not count. A compiled user
module (`.so`) counts by its bytes; what it imports is not seen.

Each file is read again only when it changes and parsed once per content
(`code_origin.file_digest`), so reaching a module costs about one `stat` per plan.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import time
import types
from dataclasses import dataclass, field

from zephyr.plan.code_origin import (
    LIBRARY_PACKAGES,
    RACY_NS,
    file_digest,
    find_spec,
    is_library,
    is_library_file,
    library_identity,
    sites_of,
)

__all__ = ["PRAGMA", "Reach", "code_lines"]

PRAGMA = "# zephyr: names listed"
# names whose use lets code reach what it does not name: in code without a source file they
# cannot be told; in a walked function, they make its whole module reachable
_DYNAMIC_NAMES = frozenset({"globals", "vars", "eval", "exec", "__import__", "import_module", "modules", "run_path",
                            "run_module", "spec_from_file_location"})


@dataclass
class Reach:
    """What a walk met: user modules (name -> (part label, file, package)), the line spans of
    their walked code, which of them any function may run from ("opaque"), library modules and
    names imported inside functions (name -> part label), and code without a source file."""

    part: str = ""  # the label of the part being walked, for messages
    modules: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    spans: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    opaque: set[str] = field(default_factory=set)
    libraries: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    fileless: list[tuple[str, str, frozenset]] = field(default_factory=list)

    def function(self, fn: types.FunctionType, names: frozenset) -> None:
        """A walked user function: its module, and the lines its code spans there."""
        name = self.namespace(fn.__globals__, opaque=False, names=names)
        if name is None:
            return
        code = fn.__code__
        if code.co_filename != self.modules[name][1] or names & _DYNAMIC_NAMES:  # made by exec, or reads its module by name
            self.opaque.add(name)
        else:
            lines = [line for _, _, line in code.co_lines() if line is not None] or [code.co_firstlineno]
            self.spans.setdefault(name, set()).add((min(code.co_firstlineno, *lines), max(lines)))

    def namespace(self, namespace: dict, opaque: bool = True, names: frozenset = frozenset()) -> str | None:
        """The module whose globals are `namespace`; returns its name when it is the user's (with a file)."""
        name, file = namespace.get("__name__"), namespace.get("__file__")
        if not isinstance(name, str):
            return None
        top = name.split(".", 1)[0]
        if top in LIBRARY_PACKAGES or top in sys.stdlib_module_names or (file is not None and is_library_file(file)):
            self.libraries.setdefault(name, self.part)
            return None
        if file is None:
            if names & _DYNAMIC_NAMES:
                self.fileless.append((self.part, name, names & _DYNAMIC_NAMES))
            return None
        if name not in self.modules:
            package = namespace.get("__package__")
            if package is None:
                package = name if os.path.basename(file).startswith("__init__.") else name.rpartition(".")[0]
            self.modules[name] = (self.part, file, package)
        if opaque:
            self.opaque.add(name)
        return name

    def module_named(self, module: str) -> None:
        """The module of a walked class (its methods are walked as functions)."""
        loaded = sys.modules.get(module)
        if loaded is not None:
            self.namespace(vars(loaded), opaque=False)
        elif is_library(module):
            self.library(module)

    def library(self, module: str | None) -> None:
        if module:
            self.libraries.setdefault(module, self.part)

    def imported(self, module: str) -> None:
        self.imports.setdefault(module, self.part)

    def key(self) -> tuple:
        """All of what the walk met, as one hashable value (for `code_lines`' memory)."""
        spans = {name: tuple(sorted(s)) for name, s in self.spans.items()}
        return (tuple(sorted(self.modules.items())), tuple(sorted(spans.items())), tuple(sorted(self.opaque)),
                tuple(sorted(self.libraries.items())), tuple(sorted(self.imports.items())), tuple(self.fileless))


def code_lines(reach: Reach) -> tuple[list[str], str]:
    """The sorted identity lines of the code `reach` leads to, and why it cannot be told ('' if
    it can). Remembered while the files and folders it read keep their inode, size and times."""
    if not (reach.modules or reach.libraries or reach.imports or reach.fileless):
        return [], ""
    key = reach.key()
    remembered = _memo.get(key)
    if remembered is not None and remembered[0] == _stamp(remembered[0][2]):
        return remembered[1], remembered[2]
    lines, problem, read = _closure_of(reach)
    stamp = _stamp(read)
    if stamp is not None:
        if len(_memo) > 1024:
            _memo.clear()
        _memo[key] = (stamp, lines, problem)
    return lines, problem


_memo: dict[tuple, tuple] = {}


def _stamp(paths: tuple[str, ...]) -> tuple | None:
    """What `code_lines` depended on: where modules are found, which are loaded, and the stat of
    every file and folder it read (None when one changed in the last 2 s: its next change could
    keep its times, so nothing is remembered)."""
    stats = []
    recent = time.time_ns() - RACY_NS
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stats.append(None)
            continue
        if st.st_ctime_ns >= recent:
            return None
        stats.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(sys.path), len(sys.modules), paths, tuple(stats)


def _closure_of(reach: Reach) -> tuple[list[str], str, tuple[str, ...]]:
    closure = _Closure()
    for label, module, names in reach.fileless:
        closure.problem([label], f"code of {module}, which has no source file, calls {', '.join(sorted(names))}")
    for name, (label, file, package) in sorted(reach.modules.items()):
        spans = None if name in reach.opaque else reach.spans.get(name, set())
        closure.user(name, file, package, [label, f"module {name}"], spans)
    for name, label in sorted(reach.imports.items()):
        closure.edge(name, False, [label])
    for name, label in sorted(reach.libraries.items()):
        closure.library(name, [label])
    closure.run()
    read = sorted(closure.read | {p for p in sys.path if p})  # a module added to a folder on sys.path
    return sorted(closure.lines), closure.problems[0] if closure.problems else "", tuple(read)


class _Closure:
    """User modules' files, followed through their imports; library and missing modules as lines."""

    def __init__(self):
        self.lines: set[str] = set()
        self.problems: list[str] = []
        self.queue: list[tuple] = []
        self.seen: set[str] = set()  # files, module names and library tops already taken
        self.read: set[str] = set()  # the files and folders the lines depend on

    def problem(self, trail: list[str], what: str) -> None:
        self.problems.append(f"{' -> '.join(t for t in trail if t)}: {what}, so the code it reaches cannot be told")

    def user(self, name: str, file: str, package: str, trail: list[str], spans: set | None = None) -> None:
        """Take a user module; `spans`: the lines of it that may run (None: any)."""
        if file not in self.seen:
            self.seen.add(file)
            self.queue.append((name, file, package, trail, spans))

    def run(self) -> None:
        while self.queue:
            self._visit(*self.queue.pop())

    def _visit(self, name: str, file: str, package: str, trail: list[str], spans: set | None) -> None:
        self.read.add(file)
        try:
            digest, data = file_digest(file)
        except OSError as e:
            self.problem(trail, f"its file {file} cannot be read ({type(e).__name__})")
            return
        # a module the stage reaches only through functions it walked (their code is in the
        # fingerprint already) counts by those: an edit elsewhere in it (another stage's function
        # in the same script) does not make this stage's work stale
        self.lines.add(f"user {name} {digest}" if spans is None else f"user {name} (walked functions)")
        scan = _scan(file, digest, data)
        for line, what in scan.dynamic:
            if spans is None or any(first <= line <= last for first, last in spans):
                self.problem(trail, f"{file}:{line} {what}")
        for target, level, optional in scan.imports:
            absolute = _absolute(target, level, package)
            if absolute:
                self.edge(absolute, optional, trail)
        for literal in scan.names:
            if literal not in self.seen and _resolve(literal)[0] == "user":
                self.edge(literal, True, trail)

    def edge(self, name: str, optional: bool, trail: list[str]) -> None:
        if name in self.seen:
            return
        self.seen.add(name)
        parent = name.rpartition(".")[0]
        if parent:  # importing a.b runs a/__init__.py first
            self.edge(parent, False, trail)
        kind, file, package = _resolve(name)
        if kind == "library":
            self.library(name, trail)
        elif kind == "user":
            self.user(name, file, package, trail + [f"module {name}"])
        elif kind == "fileless":
            self.problem(trail + [f"module {name}"], "it has no source file")
        elif kind == "missing" and not optional:
            self.lines.add(f"missing {name}")

    def library(self, name: str, trail: list[str]) -> None:
        top = name.split(".", 1)[0]
        if f"library:{top}" in self.seen:
            return
        self.seen.add(f"library:{top}")
        line = library_identity(top)
        if not line or line.startswith("dist "):  # installing or removing a distribution changes its folder
            self.read.update(sites_of(top))
        if line is None:
            self.problem(trail + [f"module {name}"], "no distribution or file tells which version of this library it is")
        else:
            self.lines.add(line)


def _absolute(target: str, level: int, package: str) -> str | None:
    """The absolute module name of an import of `target` at relative `level` from `package`."""
    if level == 0:
        return target
    parts = package.split(".") if package else []
    if level - 1 >= len(parts):
        return None  # beyond the top-level package: the import fails when run
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{target}" if target else base


_specs: dict[str, object] = {}  # module name -> its spec (None: not found), while sys.path stays as it was
_UNKNOWN = object()
_specs_path: list[tuple] = [()]


def _resolve(name: str) -> tuple[str, str | None, str]:
    """("user", file, package), or ("library"|"namespace"|"fileless"|"missing", None, "") for `name`."""
    top = name.split(".", 1)[0]
    if top in LIBRARY_PACKAGES or top in sys.stdlib_module_names or top == "builtins":
        return "library", None, ""
    loaded = sys.modules.get(name)
    if loaded is not None:
        file, is_package = getattr(loaded, "__file__", None), hasattr(loaded, "__path__")
    else:
        if _specs_path[0] != tuple(sys.path):  # where modules are found changed: look again
            _specs.clear()
            _specs_path[0] = tuple(sys.path)
        spec = _specs.get(name, _UNKNOWN)  # (one lookup: another thread may clear it meanwhile)
        if spec is _UNKNOWN:
            spec = _specs[name] = find_spec(name)
        if spec is None:
            return "missing", None, ""
        file = spec.origin if getattr(spec, "has_location", False) else None
        is_package = spec.submodule_search_locations is not None
    if file is None or not os.path.isfile(file):
        if is_package:
            return "namespace", None, ""  # a namespace package runs no code of its own
        return ("library" if name != top and _resolve(top)[0] == "library" else "fileless"), None, ""
    if is_library_file(file):
        return "library", None, ""
    return "user", file, name if is_package else name.rpartition(".")[0]


@dataclass(frozen=True)
class _Scan:
    imports: tuple[tuple[str, int, bool], ...]  # (module, relative level, optional: `from m import name` may be no module)
    dynamic: tuple[tuple[int, str], ...]  # (line, what) of each import or code the source does not name
    names: tuple[str, ...] = ()  # dotted string literals, which may name modules (`lazy_names({"pkg.mod": ...})`)


_scans: dict[str, _Scan] = {}
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def _scan(file: str, digest: str, data: bytes | None) -> _Scan:
    if digest not in _scans:
        if not file.endswith(".py"):
            _scans[digest] = _Scan((), ())
        else:
            if data is None:
                with open(file, "rb") as f:
                    data = f.read()
            _scans[digest] = _scan_source(data, file)
    return _scans[digest]


def _scan_source(data: bytes, file: str) -> _Scan:
    try:
        tree = ast.parse(data, filename=file)
    except (SyntaxError, ValueError) as e:
        return _Scan((), ((getattr(e, "lineno", 0) or 0, f"cannot be parsed ({e})"),))
    imports: list[tuple[str, int, bool]] = []
    dynamic: list[tuple[int, str]] = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(alias.name, 0, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imports.append((base, node.level, False))
            imports += [(f"{base}.{a.name}" if base else a.name, node.level, True) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            _call(node, imports, dynamic)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_sys_modules(node.value):
            _named(node.slice, node, imports, dynamic, "looks a module up in sys.modules by a computed name")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            names.add(node.value)
    vouched = {i + 1 for i, line in enumerate(data.decode("utf-8", "replace").splitlines()) if PRAGMA in line}
    return _Scan(tuple(imports), tuple(d for d in dynamic if d[0] not in vouched), tuple(sorted(names)))


_IMPORTERS = {"import_module", "__import__", "run_module"}
_RUNNERS = {"exec", "eval"}
_PATH_LOADERS = {"run_path", "spec_from_file_location", "SourceFileLoader", "load_source"}


def _call(node: ast.Call, imports: list, dynamic: list) -> None:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    first = node.args[0] if node.args else None
    if name in _IMPORTERS:
        _named(first, node, imports, dynamic, "imports a module by a computed name")
    elif name in _RUNNERS and isinstance(func, ast.Name) and not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        dynamic.append((node.lineno, f"runs code from a computed string ({_text(node)})"))
    elif name in _PATH_LOADERS:
        dynamic.append((node.lineno, f"loads code from a file by its path ({_text(node)})"))
    elif name == "get" and isinstance(func, ast.Attribute) and _is_sys_modules(func.value):
        _named(first, node, imports, dynamic, "looks a module up in sys.modules by a computed name")


def _named(arg, node, imports: list, dynamic: list, what: str) -> None:
    """A literal module name becomes an import, `__name__` is the module itself; anything else cannot be told."""
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        return
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value:
        stripped = arg.value.lstrip(".")
        imports.append((stripped, len(arg.value) - len(stripped), False))
    else:
        dynamic.append((node.lineno, f"{what} ({_text(node)})"))


def _is_sys_modules(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys"


def _text(node) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 80 else text[:77] + "..."
