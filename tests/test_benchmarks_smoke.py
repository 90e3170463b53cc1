"""Smoke test: each benchmark script runs end to end at a tiny size and prints its table.

Nothing is timed here; the benchmarks themselves (and their figures) live in `benchmarks/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, *args: str, tmp_path: Path, work_dir: bool = True) -> str:
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_USAGE_STATS_ENABLED="0")
    work = ["--work-dir", str(tmp_path / "work")] if work_dir else []
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *work, "--json", str(tmp_path / "out.json"), *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert (tmp_path / "out.json").exists()
    return proc.stdout


@pytest.mark.slow
def test_dedup_benchmark_runs_and_every_variant_keeps_the_baselines_ids(tmp_path):
    """Every zephyr variant, the one after a reshard too, in one run: it exits non-zero when
    any keeps other ids than the hand-written baseline."""
    out = _run("bench_dedup.py", "--docs", "2000", "--shards", "4", "--after-reshard", tmp_path=tmp_path)
    assert "| variant | seconds | docs/s |" in out
    assert "| hand-written sort-based" in out and "| zephyr, memory=256MiB" in out
    assert "| zephyr, no budget (buffer 256 MiB) |" in out and "| zephyr, memory=256MiB (buffer 64 MiB), after reshard |" in out


@pytest.mark.slow
def test_fuzzy_after_dedup_benchmark_runs_and_both_keep_the_same_documents(tmp_path):
    _run("bench_fuzzy_after_dedup.py", "--docs", "600", "--rounds", "1", tmp_path=tmp_path)
    result = json.loads((tmp_path / "out.json").read_text())
    assert [r["variant"] for r in result["rounds"][0]] == ["after-exact", "source"]
    assert result["rounds"][0][0]["same_kept_as_source"]


@pytest.mark.slow
def test_shard_sizing_benchmark_runs(tmp_path):
    out = _run("bench_shard_sizing.py", "--small-files", "300", "--big-gb", "0.002", "--approx", "500000", tmp_path=tmp_path)
    assert "| one per file (before) | 301 |" in out and "| approx_shard_bytes=500,000 |" in out
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert runs[0]["docs"] == runs[1]["docs"] and runs[1]["tasks"] < runs[0]["tasks"]


@pytest.mark.slow
def test_plan_rss_benchmark_runs(tmp_path):
    out = _run("bench_plan_rss.py", "--maps", "200", "--partitions", "50", "--legacy", tmp_path=tmp_path, work_dir=False)
    assert "| packed arrays (`RunIndex`) |" in out and "| per-run dicts, per-task tuples (before) |" in out


@pytest.mark.slow
@pytest.mark.ray
def test_skew_benchmark_runs(tmp_path):
    out = _run("bench_skew.py", "--records", "4000", "--keys", "500", "--repeats", "1", tmp_path=tmp_path, work_dir=False)
    assert "| uniform |" in out and "| skewed |" in out and "| skewed, splitting off |" in out


@pytest.mark.slow
@pytest.mark.ray
def test_ray_backend_benchmark_runs(tmp_path):
    out = _run("bench_ray_backend.py", "--shards", "4", "--docs-per-shard", "100", "--repeats", "1", "--tiny-shards", "50",
               tmp_path=tmp_path)
    assert "| runner | runs (s) | median (s) | best (s) |" in out
    assert "| zephyr on Ray (warm) |" in out and "| runner | ms per shard |" in out


@pytest.mark.slow
def test_parquet_pushdown_benchmark_runs(tmp_path):
    out = _run("bench_parquet_pushdown.py", "--files", "2", "--rows-per-file", "4000", "--rows-per-group", "1000",
               "--repeats", "1", tmp_path=tmp_path)
    assert "| runner | bytes read | of the files |" in out
    assert "| zephyr, pushdown |" in out and "| hand-written pyarrow.dataset scan |" in out


@pytest.mark.slow
@pytest.mark.parametrize("data", ["jsonl", "cache"])
def test_train_benchmark_runs(tmp_path, data):
    devices = ["1", "2"] if data == "jsonl" else ["1"]  # the cache path needs no second device count
    out = _run("bench_train.py", "--devices", *devices, "--steps", "12", "--repeats", "1", "--batch-size", "4",
               "--seq-len", "16", "--embed", "16", "--hidden", "32", "--shards", "2", "--data", data, tmp_path=tmp_path)
    assert "| devices | adapter | hand-written | preloaded |" in out
    assert out.count("x |") >= len(devices)  # one row per device count


@pytest.mark.slow
@pytest.mark.ray
def test_status_benchmark_runs(tmp_path):
    out = _run("bench_status.py", "--shards", "2", "--docs-per-shard", "100", "--repeats", "1", "--tiny-shards", "50",
               tmp_path=tmp_path)
    assert "| variant | wall, runs (s) |" in out
    assert "| off |" in out and "| on |" in out and "| watched |" in out and "hooks" in out


@pytest.mark.slow
def test_fuzzy_dedup_benchmark_runs(tmp_path):
    out = _run("bench_fuzzy_dedup.py", "--originals", "200", "--shards", "2", "--sample", "100", "--repeats", "1", "--no-peers",
               tmp_path=tmp_path, work_dir=False)
    result = json.loads(out)
    assert result["quality"]["zephyr"]["recall"] == 1.0  # every planted 1%-edit pair found (seeded corpus)
    assert result["speed"]["runs"][0]["same_kept"] and result["speed"]["over_script"]["zephyr_ray"] > 0


@pytest.mark.slow
def test_token_cache_benchmark_runs(tmp_path):
    out = _run("bench_token_cache.py", "--docs", "400", "--files", "2", "--batch-size", "16", "--seq-len", "32",
               "--vocab", "300", tmp_path=tmp_path)
    assert "| zephyr tokenize step (sync) |" in out and "| hand-written loop |" in out
    assert "| 16 |" in out


@pytest.mark.slow
def test_columnar_benchmark_runs(tmp_path):
    """zephyr's two paths only (the peers are in the bench group, which CI does not install), on
    the parquet job (each variant starts a Ray: the dedup job is bench_dedup's, smoke-tested
    above; W1's ops are covered by the parquet job's, and by the batch property tests)."""
    out = _run("bench_columnar.py", "--docs", "2000", "--shards", "2", "--peers", "", "--runs", "1",
               "--jobs", "parquet", tmp_path=tmp_path)
    assert "| zephyr-batches |" in out and "| zephyr-records |" in out
    batches = [line for line in out.splitlines() if line.startswith("| zephyr-batches |")]
    assert len(batches) == 1 and all("| True |" in line for line in batches)  # the record path's bytes


@pytest.mark.slow
def test_intra_shard_benchmark_runs(tmp_path):
    out = _run("bench_intra_shard.py", "--rows", "3000", "--work", "5", "--repeats", "1", tmp_path=tmp_path)
    result = json.loads(out)
    assert result["runs"][0]["same_rows"] and result["median_s"]["auto"] > 0


@pytest.mark.slow
def test_signature_batches_benchmark_runs(tmp_path):
    """Its Arrow shingles must equal minhash.shingles (the script asserts it) before it prints."""
    out = _run("bench_signature_batches.py", "--originals", "40", tmp_path=tmp_path, work_dir=False)
    assert "| shingles: pyarrow.compute (batches) |" in out
    assert json.loads((tmp_path / "out.json").read_text())["docs"] == 80


@pytest.mark.slow
def test_jsonl_scan_benchmark_runs(tmp_path):
    """The script asserts that every scan finds the same blocks before it prints."""
    out = _run("bench_jsonl_scan.py", "--docs", "2000", "--repeats", "1", tmp_path=tmp_path)
    assert "| zephyr _long_digits |" in out and "| translate + find (before) |" in out


@pytest.mark.slow
def test_task_engines_benchmark_runs(tmp_path):
    """The Python loop and pyarrow on every job (the native engines are in the bench group, which CI
    does not install): every output agrees with the script's plain-Python oracle."""
    pytest.importorskip("xxhash")  # the loop's and pyarrow's hash; in the bench group
    _run("bench_task_engines.py", "--docs", "1600", "--w1-docs", "800", "--repeats", "1", "--engines", "python,pyarrow",
         "--skip-exactness", tmp_path=tmp_path)
    results = json.loads((tmp_path / "out.json").read_text())["results"]
    assert len(results) == 18 and all(r["check"]["ok"] for r in results), [r.get("check") or r.get("error") for r in results]


@pytest.mark.slow
def test_web_benchmark_runs(tmp_path):
    from marin.web.debian_docs import missing_packages

    if missing := missing_packages():  # as the web tests: fail in CI, skip elsewhere
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"Debian documentation packages missing: {' '.join(missing)}")
    out = _run("bench_web.py", "--per-manual", "1", "--rounds", "1", "--step-rounds", "1", "--no-datatrove",
               "--variants", "zephyr-threadpool,hand", tmp_path=tmp_path)
    assert "| quality | marin.web |" in out and "| quality | hand |" in out
    assert "| zephyr-threadpool |" in out and "| hand |" in out
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["agreement"]["hand"]["agree"] == 1.0  # the same libraries, the same decisions


@pytest.mark.slow
def test_cc_rounds_benchmark_runs(tmp_path):
    out = _run("bench_cc_rounds.py", "--links", "10", "50", "--cluster", "200", "--simulate", tmp_path=tmp_path, work_dir=False)
    assert "| links | rounds | total s |" in out and "cluster of 200:" in out and "| 50 | shuffled ids |" in out
