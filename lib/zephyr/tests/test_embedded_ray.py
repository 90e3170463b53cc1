"""The first minutes on an embedded Ray (issue 24): fast, quiet, and not started when nothing runs."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zephyr import Dataset, create_backend
from zephyr.backends.ray import RayBackend

REPO = Path(__file__).resolve().parents[3]
MAX_CLEAN_RUN_LINES = 15

# Lines of Ray's and uv's own that a clean run used to print (issue 24, item 2).
CHATTER = ("Token authentication", "is now ignored", "Ignoring upload to cluster", "does not match the project",
           "Creating virtual environment", "Pushing file package", "Started a local Ray instance")

WORKERS = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from zephyr import Dataset, flow_backend

    def where(i):
        env = ray.get_runtime_context().runtime_env
        return {"i": i, "python": sys.executable, "py_executable": env.get("py_executable"),
                "working_dir": env.get("working_dir")}

    def main():
        out = sys.argv[1]
        ds = Dataset.from_list([0, 1]).map(where).write_jsonl(out + "/{shard}.jsonl", skip_existing=True)
        list(flow_backend().execute(ds))
    """
)


class _NoRayBackend(RayBackend):
    """The Ray backend, refusing to start or reach Ray: what a run that needs no task may use."""

    def _ray(self):
        raise AssertionError("Ray was started for a run whose outputs all exist")


def _write(items, out, backend):
    ds = Dataset.from_list(items).map(lambda x: {"x": x}).write_jsonl(f"{out}/part-{{shard}}.jsonl", skip_existing=True)
    return list(backend.execute(ds))


def test_rerun_with_every_output_current_starts_no_ray(tmp_path):
    """Regression (issue 24): a rerun whose skip_existing outputs all exist started Ray (~25 s)."""
    items = [1, 2, 3]
    first = _write(items, tmp_path, create_backend("sync"))
    backend = _NoRayBackend(2, progress=False)
    try:
        assert _write(items, tmp_path, backend) == first == [f"{tmp_path}/part-{i}.jsonl" for i in range(3)]
    finally:
        backend.close()


def test_rerun_with_one_output_missing_still_runs_its_task(tmp_path):
    """The shortcut only applies when nothing is left to do: a missing output reaches the backend."""
    items = [1, 2, 3]
    _write(items, tmp_path, create_backend("sync"))
    os.remove(tmp_path / "part-1.jsonl")
    backend = _NoRayBackend(2, progress=False)
    with pytest.raises(AssertionError, match="Ray was started"):
        _write(items, tmp_path, backend)
    backend.close()


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """The `zephyr` command on an embedded Ray, under `uv run` as the README says, with Ray's
    default for `uv run` drivers left on (the test suite turns it off for its own Rays)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    tmp = tmp_path_factory.mktemp("embedded")
    (tmp / "workers.py").write_text(WORKERS)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_ADDRESS")}
    command = [uv, "run", "--no-sync", "zephyr", "--backend=ray", "--max-parallelism=2", str(tmp / "workers.py"), str(tmp / "out")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp, result


@pytest.mark.ray
@pytest.mark.slow
def test_embedded_ray_workers_use_the_drivers_interpreter(clean_run):
    """Regression (issue 24): workers started through `uv run` in a copy of the working
    directory, building and byte-compiling a second virtualenv on every run."""
    import orjson

    tmp, _ = clean_run
    rows = [orjson.loads(line) for p in sorted((tmp / "out").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert [r["i"] for r in rows] == [0, 1]
    venv_python = str(REPO / ".venv" / "bin" / "python")
    for row in rows:
        assert row["py_executable"] is None and row["working_dir"] is None
        assert row["python"] == venv_python  # not a venv that Ray built for the workers elsewhere


@pytest.mark.ray
@pytest.mark.slow
def test_clean_embedded_run_is_quiet_and_says_where_ray_is(clean_run):
    """Regression (issue 24): a clean run printed ~31 lines, most of them Ray's and uv's."""
    _, result = clean_run
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) <= MAX_CLEAN_RUN_LINES, "\n".join(lines)
    assert not [line for line in lines if any(c in line for c in CHATTER)]
    started = [line for line in lines if line.startswith("zephyr: started a local Ray")]
    assert len(started) == 1, lines
    port = int(re.search(r"dashboard http://127\.0\.0\.1:(\d+)", started[0]).group(1))
    assert port != 8265  # Ray's default port belongs to a `ray start` on this machine, if any
    assert "logs /tmp/ray/session_" in started[0] or "logs " in started[0]
