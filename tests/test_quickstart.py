"""The quickstart from a user's seat: runs end to end, a rerun skips every step, and changing a
versioned parameter reruns exactly the steps that depend on it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


def test_quickstart_end_to_end_then_skip_then_partial_rerun(tmp_path):
    prefix = tmp_path / "prefix"
    first = run("experiments/quickstart.py", "--prefix", str(prefix))
    assert first.returncode == 0, first.stderr[-4000:]
    assert "quickstart summary" in first.stdout
    [summary_dir] = list((prefix / "quickstart").glob("summary-*"))
    summary = orjson.loads((summary_dir / "summary.json").read_bytes())
    docs = summary["documents"]
    assert docs["raw"] == 12_000
    assert docs["raw"] > docs["after_filters"] > docs["after_dedup"] == docs["tokenized"] > 0
    assert set(summary["dropped_by_filter"]) == {"too_short", "symbols", "repetitive", "shouting"}
    assert sum(summary["dropped_by_filter"].values()) == docs["raw"] - docs["after_filters"]
    assert 0.05 < summary["dedup_rate"] < 0.5
    assert docs["after_filters"] > docs["after_exact_dedup"] > docs["after_dedup"]  # near copies survive exact dedup
    assert summary["near_duplicates_removed"] == docs["after_exact_dedup"] - docs["after_dedup"] > 0
    assert "near copies removed" in first.stdout
    losses = [loss for _, loss in summary["loss_curve"]]
    assert summary["train"]["steps"] == 300 and losses[-1] < losses[0] - 0.5  # it learned
    assert summary["train"]["devices"] == 4  # data-parallel over the simulated v4-8 host's 4 chips
    assert (summary_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    outputs = {p.name: p.stat().st_mtime_ns for p in (prefix / "quickstart").iterdir()}

    second = run("experiments/quickstart.py", "--prefix", str(prefix))
    assert second.returncode == 0, second.stderr[-4000:]
    assert "quickstart summary" in second.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (prefix / "quickstart").iterdir()} == outputs  # nothing rewritten

    # a different versioned parameter for the clean step: raw is reused, everything downstream reruns
    script = tmp_path / "rerun.py"
    script.write_text(textwrap.dedent(
        f"""
        import importlib.util, sys, cloudpickle
        spec = importlib.util.spec_from_file_location("quickstart", "experiments/quickstart.py")
        qs = sys.modules["quickstart"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(qs)
        cloudpickle.register_pickle_by_value(qs)  # Ray workers cannot import experiments/
        import ray.cloudpickle; ray.cloudpickle.register_pickle_by_value(qs)  # Ray pickles with its own copy
        from marin.execution import Executor
        qs.start_ray()
        outcome = Executor({str(prefix)!r}).run(qs.build_steps(min_words=30))
        for path, status in sorted(outcome.items()):
            print(path.rsplit("/", 1)[-1].rsplit("-", 1)[0], status)
        """
    ))
    third = run(str(script))
    assert third.returncode == 0, third.stderr[-4000:]
    statuses = dict(line.split() for line in third.stdout.splitlines() if line.split()[-1] in ("SUCCESS", "SKIPPED"))
    assert statuses == {"raw": "SKIPPED", "clean": "SUCCESS", "tokens": "SUCCESS", "train": "SUCCESS", "summary": "SUCCESS"}
    assert len(list((prefix / "quickstart").glob("raw-*"))) == 1
    assert len(list((prefix / "quickstart").glob("clean-*"))) == 2
