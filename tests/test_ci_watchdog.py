"""The test run's own watchdog (root conftest): a hung test cannot hold CI until CI's limit.

A test that swallows pytest-timeout's exception and waits on is ended by the watchdog once its
timeout plus the grace has passed (a worker stuck collecting, once the collection timeout has),
with every thread's stack in the output; xdist reports the crash and how the worker died, and the
worker that replaces the dead one does not run the test again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HUNG = textwrap.dedent(
    """
    import time

    import pytest


    @pytest.mark.timeout(1)
    def test_hangs_past_its_timeout():
        try:
            time.sleep(60)
        except BaseException:  # pytest-timeout's exception, swallowed: only the watchdog ends this
            time.sleep(600)


    def test_after_it():
        pass
    """
)


def run_pytest(tmp_path: Path, test_file: str, *args: str, **env_vars: str) -> tuple[int, str]:
    """pytest on `tmp_path/test_file` (outside the workspace) with the workspace's conftest as a
    plugin, in one xdist worker; its exit status and output."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZEPHYR_TESTS_RUNNING_DIR", "PYTEST_ADDOPTS")}
    env |= {"PYTHONPATH": str(ROOT), **env_vars}
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", os.devnull,
            "--rootdir", str(tmp_path), "-n", "1", "--dist", "loadfile", "--timeout", "600", "-ra", *args, test_file]
    # a session of its own: if the watchdog failed, the hung worker is killed with the run, not left behind
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out


@pytest.mark.slow
def test_a_test_that_hangs_past_its_timeout_is_ended_and_not_run_again(tmp_path):
    (tmp_path / "test_hung.py").write_text(HUNG)
    returncode, out = run_pytest(tmp_path, "test_hung.py", ZEPHYR_TESTS_HARD_TIMEOUT_GRACE="2")
    assert returncode == 1, out[-3000:]
    assert "Timeout (0:00:03)!" in out and "in test_hangs_past_its_timeout" in out, out[-3000:]  # the stacks
    assert "crashed while running 'test_hung.py::test_hangs_past_its_timeout'" in out, out[-3000:]
    assert "the worker process exited with status 1" in out, out[-3000:]  # how it died: faulthandler's exit
    assert "its worker process died while running it" in out, out[-3000:]  # skipped in the new worker
    assert "1 failed, 1 passed, 1 skipped" in out, out[-3000:]


@pytest.mark.slow
def test_a_worker_whose_collection_hangs_is_ended(tmp_path):
    """An import that never returns holds a worker in collection, where no test timeout applies:
    the collection watchdog ends it with its stack, and the run ends."""
    (tmp_path / "test_import_hangs.py").write_text("import time\n\ntime.sleep(600)\n\n\ndef test_never():\n    pass\n")
    returncode, out = run_pytest(tmp_path, "test_import_hangs.py", "--max-worker-restart=0",
                                  ZEPHYR_TESTS_COLLECTION_TIMEOUT="3")
    assert returncode != 0, out[-3000:]
    assert "Timeout (0:00:03)!" in out and "test_import_hangs.py\", line 3" in out, out[-3000:]
