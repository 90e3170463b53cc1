"""The workspace's uv settings: `uv run` does not recompile the environment each time, and CI
compiles it once before the tests (docs/ci.md)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a `uv sync` (a no-op install, seconds on a loaded machine)
def test_uv_sync_compiles_no_bytecode_unless_asked():
    """Regression (issue 38): `compile-bytecode = true` under [tool.uv] made every `uv run`
    recompile all 9,412 modules of the environment and say so ("Bytecode compiled 9412 files")."""
    uv = shutil.which("uv")
    if uv is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("CI runs through uv (.ci/run installs it), but uv is not on PATH")
        pytest.skip("uv is not on PATH")
    # what `uv run` does first; --frozen and --inexact: installs only what is missing, removes nothing
    done = subprocess.run([uv, "sync", "--frozen", "--inexact"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Bytecode compiled" not in done.stderr, done.stderr[-2000:]


def test_ci_compiles_bytecode_once_before_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert lines.index("uv sync --compile-bytecode") < lines.index("uv run pytest")
