"""Marin's layout: imports flow one way (no circles), read from the source with ast.

Uses the project's own graph builder (scripts/import_cycles.py), which counts every import:
module top, inside functions and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import marin

ROOT = Path(__file__).resolve().parents[3]
MARIN_DIR = Path(marin.__file__).resolve().parent


def _tool():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_graph_builder_finds_a_planted_circle(tmp_path):
    """The check can fail: two modules that import each other (one inside a function) are a circle."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text("def f():\n    from pkg import a\n")
    (package / "c.py").write_text("import pkg.a\n")
    tool = _tool()
    assert tool.import_cycles(tool.import_graph([package])) == [["pkg.a", "pkg.b"]]


def test_graph_builder_counts_the_package_init_an_import_runs(tmp_path):
    """`import facade.impl` runs facade/__init__ first: a circle when that __init__ imports the importer."""
    for name, files in {
        "facade": {"__init__.py": "from user.step import run\n", "impl.py": "X = 1\n"},
        "user": {"__init__.py": "", "step.py": "from facade.impl import X\n"},
    }.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    tool = _tool()
    graph = tool.import_graph([tmp_path / "facade", tmp_path / "user"])
    assert graph["user.step"] == {"facade", "facade.impl"}
    assert graph["facade.impl"] == set()  # its own package's __init__ is no edge
    assert tool.import_cycles(graph) == [["facade", "user.step"]]


def test_marin_has_no_import_circles():
    """Regression (issue 22): marin.run.ray_run <-> marin.cluster.local / marin.cluster.target."""
    tool = _tool()
    graph = tool.import_graph([MARIN_DIR])
    assert "marin.run.ray_run" in graph and graph["marin.cluster.cli"], "the graph builder found no modules"
    assert tool.import_cycles(graph) == []


def test_slice_table_imports_neither_ray_nor_jax():
    """The cluster tooling and the job launcher import marin.tpu.slices: no Ray or JAX for that."""
    probe = "import sys, marin.cluster.local, marin.run.ray_run, marin.tpu.slices; print(sorted({'ray', 'jax'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_facades_resolve_every_name():
    """marin.tpu (the earlier home of the training names) and marin.training export what they list."""
    import marin.tpu
    import marin.training

    for facade in (marin.tpu, marin.training):
        missing = [name for name in facade.__all__ if not hasattr(facade, name)]
        assert missing == [], f"{facade.__name__} lists names it cannot load: {missing}"
    assert marin.tpu.train_loop is marin.training.train_loop


def _code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from its first statement after the docstring to its end."""
    body = function.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1
    return function.end_lineno - body[1 if has_doc else 0].lineno + 1


def test_no_marin_function_is_over_60_lines_of_code():
    """Issue 22: train_loop (143 lines), run_on_tpu and the cluster CLI's build_parser did many jobs at once."""
    long = []
    for path in sorted(MARIN_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > 60:
                long.append(f"{path.relative_to(MARIN_DIR)}:{node.lineno} {node.name} ({_code_lines(node)} lines)")
    assert long == []
