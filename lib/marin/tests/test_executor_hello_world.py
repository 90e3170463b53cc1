"""experiments/hello_world.py end to end, as a user runs it: a subprocess with --prefix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HELLO = os.path.join(REPO_ROOT, "experiments", "hello_world.py")


def run(script, *args):
    proc = subprocess.run([sys.executable, str(script), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    return sorted(re.findall(r"Running step (\S+)", output)), sorted(re.findall(r"Step (\S+) already succeeded", output))


@pytest.mark.slow
def test_hello_world_runs_skips_and_reruns_affected_steps(tmp_path):
    prefix = str(tmp_path / "x")
    assert run(HELLO, "--prefix", prefix) == (["hello_world/numbers", "hello_world/stats"], [])
    (stats_dir,) = (tmp_path / "x" / "hello_world").glob("stats-*")
    stats = json.loads((stats_dir / "stats.json").read_text())
    assert stats["count"] == 100 and 0 <= stats["min"] <= stats["mean"] <= stats["max"] <= 100
    assert run(HELLO, "--prefix", prefix) == ([], ["hello_world/numbers", "hello_world/stats"])

    source = open(HELLO).read()
    decimals = tmp_path / "hello_decimals.py"
    decimals.write_text(source.replace("decimals=versioned(2)", "decimals=versioned(3)"))
    assert run(decimals, "--prefix", prefix) == (["hello_world/stats"], ["hello_world/numbers"])

    more = tmp_path / "hello_more.py"
    more.write_text(source.replace("n=versioned(100)", "n=versioned(50)"))
    lines = subprocess.run(
        [sys.executable, str(more), "--prefix", prefix, "--dry_run", "true"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["run", "hello_world/numbers"], ["wait", "hello_world/stats"]]
    assert run(more, "--prefix", prefix) == (["hello_world/numbers", "hello_world/stats"], [])
    assert len(list((tmp_path / "x" / "hello_world").glob("stats-*"))) == 3
    assert len(list((tmp_path / "x" / "experiments").glob("hello_*.json"))) == 3
