"""`experiments/train_tiny_lm.py` as a user runs it (issue 24, item 3): every log line once,
the executor's step lines on the console, and a last line with the final step, loss and
checkpoint path, also when a rerun skips the training (and starts no Ray)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(prefix: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MARIN_PREFIX")}
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "train_tiny_lm.py"), "--prefix", str(prefix)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return (done.stdout + done.stderr).splitlines()


def _messages(lines: list[str]) -> list[str]:
    """Log lines without their timestamp and Ray's worker prefix, so one message printed twice
    through two handlers (in two formats) counts twice."""
    out = []
    for line in lines:
        line = re.sub(r"^\x1b\[\d+m\(\w+ pid=\d+\)\x1b\[0m ", "", line)
        line = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", "", line)
        out.append(re.sub(r"^(INFO|WARNING) ?:?(marin[\w.]*):? ?", r"\2 ", line))
    return out


@pytest.mark.slow
@pytest.mark.ray
def test_train_tiny_lm_prints_each_line_once_and_ends_with_its_result(tmp_path):
    first = _run(tmp_path)
    messages = [m for m in _messages(first) if m.startswith("marin")]
    repeated = [m for m, n in Counter(messages).items() if n > 1]
    assert messages and not repeated, repeated  # was: every training line twice
    assert any("Running step tiny_lm/train" in m for m in messages)  # the executor's lines show
    last = first[-1] if "train_tiny_lm:" in first[-1] else next(l for l in reversed(first) if l.startswith("train_tiny_lm:"))
    match = re.search(r"trained to step (\d+), loss ([\d.]+); checkpoints in (\S+)", last)
    assert match, first[-5:]
    assert int(match.group(1)) == 200 and float(match.group(2)) > 0
    assert Path(match.group(3)).is_dir() and match.group(3).startswith(str(tmp_path))
    assert any(l.startswith("train_tiny_lm: started a local Ray") for l in first), first[-5:]
    again = _run(tmp_path)
    assert any(l.startswith("train_tiny_lm: already trained (skipped) to step 200") for l in again), again[-5:]
    assert any("Step tiny_lm/train already succeeded; skipping" in l for l in again)
    assert not any("started a local Ray" in l for l in again), again  # nothing to run: no Ray started
