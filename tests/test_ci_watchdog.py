"""The test run's own watchdog (root conftest): a hung test cannot hold CI until CI's limit.

A test that swallows pytest-timeout's exception and waits on is ended by the watchdog once its
timeout plus the grace has passed, with every thread's stack in the output; xdist reports the
crash and how the worker died, and the worker that replaces the dead one does not run the test
again.
"""

from __future__ import annotations

import os
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


@pytest.mark.slow
def test_a_test_that_hangs_past_its_timeout_is_ended_and_not_run_again(tmp_path):
    (tmp_path / "test_hung.py").write_text(HUNG)
    env = {k: v for k, v in os.environ.items() if k not in ("ZEPHYR_TESTS_RUNNING_DIR", "PYTEST_ADDOPTS")}
    env |= {"ZEPHYR_TESTS_HARD_TIMEOUT_GRACE": "2", "PYTHONPATH": str(ROOT)}
    # the workspace's conftest as a plugin, on a test file outside the workspace
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", os.devnull,
            "--rootdir", str(tmp_path), "-n", "1", "--dist", "loadfile", "--timeout", "600", "-ra", "test_hung.py"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "Timeout (0:00:03)!" in out and "in test_hangs_past_its_timeout" in out, out[-3000:]  # the stacks
    assert "crashed while running 'test_hung.py::test_hangs_past_its_timeout'" in out, out[-3000:]
    assert "the worker process exited with status 1" in out, out[-3000:]  # how it died: faulthandler's exit
    assert "its worker process died while running it" in out, out[-3000:]  # skipped in the new worker
    assert "1 failed, 1 passed, 1 skipped" in out, out[-3000:]
