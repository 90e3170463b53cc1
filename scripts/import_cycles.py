"""Find import circles in the project's packages, from the source (ast), without importing it.

    uv run python scripts/import_cycles.py                # marin and zephyr
    uv run python scripts/import_cycles.py lib/marin/src/marin

Every import counts: at module top, inside functions and under ``if TYPE_CHECKING:``. An
edge goes to the module a statement names: ``from pkg import sub`` to ``pkg.sub`` when
``sub`` is a module, ``from pkg import name`` to ``pkg`` (its ``__init__``) otherwise. Importing
``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b`` first: an edge to each of those too,
except to the importer's own enclosing packages (they are already running when it is imported),
so a package ``__init__`` that re-exports its submodules is no circle, while a submodule that
imports a sibling through that ``__init__`` (``from pkg import name``) is.
Prints each strongly connected component of more than one module (or a module importing
itself) and exits 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["import_graph", "import_cycles", "function_imports"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGES = (ROOT / "lib/marin/src/marin", ROOT / "lib/zephyr/src/zephyr")


def _modules(package_dir: Path) -> dict[str, Path]:
    """Map each module name under `package_dir` (a package folder) to its file."""
    base = package_dir.parent
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _ancestors(module: str) -> set[str]:
    """The enclosing packages of a dotted module name: "a.b.c" -> {"a", "a.b"}."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The project modules one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    targets = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            targets.append(sub)
        elif base in known:
            targets.append(base)
    return targets


def import_graph(package_dirs=DEFAULT_PACKAGES) -> dict[str, set[str]]:
    """Module name -> the project modules it imports (anywhere in its source)."""
    files = {}
    for package_dir in package_dirs:
        files.update(_modules(Path(package_dir)))
    known = set(files)
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, module, is_package, known))
        own = _ancestors(module) | ({module} if is_package else set())
        edges |= {parent for target in edges for parent in _ancestors(target) if parent in known} - own
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with a circle in them (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return sorted(components)


def function_imports(package_dirs=DEFAULT_PACKAGES) -> list[tuple[str, int, str]]:
    """(file, line, imported module) of every import inside a function, for review."""
    found = []
    for package_dir in package_dirs:
        for path in _modules(Path(package_dir)).values():
            tree = ast.parse(path.read_text(), filename=str(path))
            for func in ast.walk(tree):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, ast.Import):
                        found += [(str(path), node.lineno, alias.name) for alias in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        found.append((str(path), node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(found))


def main(argv: list[str]) -> int:
    dirs = [Path(arg).resolve() for arg in argv if not arg.startswith("-")] or list(DEFAULT_PACKAGES)
    if "--function-imports" in argv:
        for path, line, name in function_imports(dirs):
            print(f"{Path(path).relative_to(ROOT)}:{line}: {name}")
    cycles = import_cycles(import_graph(dirs))
    for component in cycles:
        print("circle:", " <-> ".join(component))
    print(f"{len(cycles)} import circle(s) in {', '.join(d.name for d in dirs)}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
