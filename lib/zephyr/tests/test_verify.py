"""Outputs verified: the run record lists each output's size and record count, and `zephyr verify DIR`
names every missing, truncated or extra file (exit 0 only when all match).

The record-writing part runs on every backend; the oracle is the files themselves (their sizes on
disk, their lines counted in plain Python). The verify command itself reads files only.
"""

from __future__ import annotations

import json
import os

import pytest

from zephyr import Dataset, create_backend
from zephyr.cli import main as zephyr_main
from zephyr.status import read_run_record
from zephyr.status.outputs import verify_directory


def rows(i):
    return [{"shard": i, "j": j, "text": "x" * (i * 7 + j)} for j in range(i + 1)]


def poison_37(x):
    if x == 37:
        raise ValueError("poison")
    return {"x": x}


def run_pipeline(backend, out, skip_existing=False):
    ds = Dataset.from_list(list(range(6))).flat_map(rows).write_jsonl(str(out / "part-{shard:05d}.jsonl"), skip_existing=skip_existing)
    list(backend.execute(ds))


def on_disk(out) -> list[dict]:
    """The oracle: each visible file's size and line count, read directly."""
    return [{"path": p.name, "bytes": p.stat().st_size, "records": len(p.read_text().splitlines())}
            for p in sorted(out.iterdir()) if not p.name.startswith(".")]


def test_the_run_record_lists_each_output_with_its_size_and_records(backend, tmp_path):
    out = tmp_path / "out"
    run_pipeline(backend, out)
    record = read_run_record(str(out))
    assert record["outputs"] == on_disk(out)
    assert [o["records"] for o in record["outputs"]] == [i + 1 for i in range(6)]
    assert verify_directory(str(out)).ok


def test_verify_names_the_truncated_the_missing_and_the_extra_file(tmp_path, capsys):
    out = tmp_path / "out"
    run_pipeline(create_backend("sync", progress=False), out)
    assert zephyr_main(["verify", str(out)]) == 0
    assert "all 6 recorded output(s) present" in capsys.readouterr().out
    truncated = out / "part-00003.jsonl"
    truncated.write_bytes(truncated.read_bytes()[:-5])
    os.remove(out / "part-00005.jsonl")
    (out / "stray.txt").write_text("not ours")
    (out / "sub").mkdir()
    (out / "sub" / "deeper.jsonl").write_text("{}\n")
    assert zephyr_main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "4 problem(s) among 6 recorded output(s)" in err
    assert "missing:   part-00005.jsonl" in err
    assert "truncated: part-00003.jsonl" in err
    assert "extra:     stray.txt (8 bytes" in err and "extra:     sub/deeper.jsonl" in err
    assert zephyr_main(["verify", "--json", str(out / ".zephyr-run.json")]) == 1
    found = json.loads(capsys.readouterr().out)
    assert [m["path"] for m in found["missing"]] == ["part-00005.jsonl"]
    assert [(t["path"], t["found_bytes"]) for t in found["truncated"]] == [("part-00003.jsonl", truncated.stat().st_size)]
    assert [e["path"] for e in found["extra"]] == ["stray.txt", "sub/deeper.jsonl"] and found["ok"] is False


def test_an_output_pattern_with_a_doubled_slash_verifies(tmp_path):
    """Regression: `f"{OUT}/part-{{shard}}.jsonl"` with OUT ending in "/" wrote out/part-00000.jsonl
    (the disk ignores "//") but recorded "/part-00000.jsonl", so verify reported every output
    missing and every file extra."""
    out = tmp_path / "out"
    ds = Dataset.from_list(list(range(3))).flat_map(rows).write_jsonl(f"{out}//part-{{shard:05d}}.jsonl")
    list(create_backend("sync", progress=False).execute(ds))
    assert read_run_record(str(out))["outputs"] == on_disk(out)
    assert verify_directory(str(out)).ok


def test_verify_without_a_record_says_so(tmp_path, capsys):
    assert zephyr_main(["verify", str(tmp_path)]) == 1
    assert f"no run record at {tmp_path}" in capsys.readouterr().err


def test_a_skip_existing_rerun_keeps_the_counts_of_the_outputs_it_kept(tmp_path):
    out = tmp_path / "out"
    backend = create_backend("threadpool", max_parallelism=3, progress=False)
    run_pipeline(backend, out, skip_existing=True)
    os.remove(out / "part-00002.jsonl")
    run_pipeline(backend, out, skip_existing=True)  # 5 kept, 1 written again
    assert read_run_record(str(out))["outputs"] == on_disk(out)
    assert verify_directory(str(out)).ok


def test_a_run_with_a_quarantined_shard_does_not_verify(tmp_path, capsys):
    out = tmp_path / "out"
    backend = create_backend("sync", progress=False, on_shard_failure="quarantine")
    ds = Dataset.from_list([36, 37, 38]).map(poison_37).write_jsonl(str(out / "p-{shard}.jsonl"))
    with pytest.raises(RuntimeError):
        list(backend.execute(ds))
    assert zephyr_main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the recorded run did not succeed (state: failed)" in err and "quarantined: stage 0, shard 1" in err
