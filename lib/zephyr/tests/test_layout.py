"""The layout keeps its promises: layers import downwards only, no import circles, and imports
inside functions only for heavy optional dependencies (docs/architecture.md draws the map)."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

import zephyr

ROOT = pathlib.Path(zephyr.__file__).parent
REPO = ROOT.parents[3]

# bottom to top; a module may import its own layer and the layers below it
LAYERS = [
    ("core", {"zephyr.errors", "zephyr.counters", "zephyr.resources", "zephyr.tasks", "zephyr.naming", "zephyr.cost",
              "zephyr.out_of_memory", "zephyr.switches", "zephyr.canonical"}),
    ("expr", {"zephyr.expr"}),
    ("io", {"zephyr.io"}),
    ("engine", {"zephyr.engine"}),
    ("shuffle", {"zephyr.shuffle", "zephyr.dedup"}),
    ("aggregate", {"zephyr.aggregate"}),
    ("plan", {"zephyr.plan"}),
    ("status", {"zephyr.status"}),
    ("execution", {"zephyr.execution"}),
    ("backends", {"zephyr.backends"}),
    ("entry points", {"zephyr", "zephyr.cli", "zephyr.__main__", "zephyr.dataset", "zephyr.readers", "zephyr.writers",
                      "zephyr.context", "zephyr.worker_context", "zephyr.runners"}),
]
# what may be imported inside a function: heavy or optional, where a path must not need it
LAZY_OK = ("pyarrow", "ray", "rensa", "tqdm", "fsspec", "gcsfs", "vortex", "zephyr.status.server", "zephyr.status.commands",
           "zephyr.io.warc",  # fastwarc, loaded only where WARC files are read or cut
           "grpc")  # Ray's gRPC, only when a run on a reused Ray starts the next run's workers
# (module, import) pairs allowed to point upward: the reference project's `zephyr.execution.ZephyrContext`
# path, resolved on first use by the package's __getattr__ so that the runner never imports the backends
COMPAT_UPWARD = {("zephyr.execution", "zephyr.context")}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: pathlib.Path, modules: dict) -> list[tuple[str, bool, str]]:
    """(imported zephyr module or other top name, inside a function?, statement) per import."""
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            found.append((target, id(node) in in_function, ast.unparse(node)))
    return found


def _layer_of(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") and prefix != "zephyr":
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return best[0]


def _graph(lazy_compat: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    return {m: {t for t, _, _ in _imports(m, p, modules) if t in modules and t != m and (lazy_compat or (m, t) not in COMPAT_UPWARD)}
            for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The project's one cycle finder (scripts/import_cycles.py, Tarjan's algorithm)."""
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.import_cycles(graph)


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles():
    """Every import counts, TYPE_CHECKING and function-level ones too (only the lazily resolved
    compatibility path is left out: it runs after both packages are loaded)."""
    assert _cycles(_graph(lazy_compat=False)) == []


def test_layers_import_downwards_only():
    graph = _graph()
    upward = [f"{m} ({LAYERS[_layer_of(m)][0]}) imports {t} ({LAYERS[_layer_of(t)][0]})"
              for m, targets in graph.items() for t in targets if _layer_of(t) > _layer_of(m) and (m, t) not in COMPAT_UPWARD]
    assert upward == []


def test_imports_inside_functions_only_for_heavy_dependencies():
    modules = _modules()
    lazy = [f"{m}: {statement}" for m, p in modules.items() for target, inside, statement in _imports(m, p, modules)
            if inside and not target.startswith(LAZY_OK) and (m, target) not in COMPAT_UPWARD]
    assert lazy == []


@pytest.mark.parametrize("module", ["zephyr.dataset", "zephyr.readers", "zephyr.expr", "zephyr.counters", "zephyr.execution",
                                    "zephyr.context", "zephyr.worker_context"])
def test_public_paths_import(module):
    """The reference project's module paths stay importable."""
    __import__(module)


def test_the_reference_context_names_resolve_from_zephyr_execution():
    import zephyr.context
    import zephyr.execution

    assert zephyr.execution.ZephyrContext is zephyr.context.ZephyrContext
    assert zephyr.execution.zephyr_worker_ctx is zephyr.context.zephyr_worker_ctx
    with pytest.raises(AttributeError):
        zephyr.execution.NoSuchName  # noqa: B018


def test_architecture_map_names_every_folder():
    """docs/architecture.md lists each package folder, so the map matches the tree."""
    doc = (ROOT.parents[3] / "docs" / "architecture.md").read_text()
    folders = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    missing = [f for f in folders if f"zephyr/{f}/" not in doc]
    assert missing == []
