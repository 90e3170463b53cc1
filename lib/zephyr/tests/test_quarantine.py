"""Quarantine (`on_shard_failure="quarantine"`): a poison shard is set aside, everything else finishes.

Oracles are plain Python over the inputs minus the quarantined shard; a rerun with the poison
fixed must equal a clean run's output, recomputing only what the quarantined shard touched.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, QuarantineLimitError, QuarantinedShardsError, ShardError, create_backend
from zephyr.status import read_run_record
from zephyr.status.outputs import verify_directory

POISON = 37


def poisoned(item):
    """`item` is (x, fixed_marker): x == POISON raises until the marker file exists (the fix)."""
    x, fixed = item
    if x == POISON and not os.path.exists(fixed):
        raise ValueError(f"poison record {x}")
    return {"x": x, "key": x % 7}


def spread(item):
    """Shard `item` = (x, fixed) becomes 50 records; shard POISON fails at its 41st (mid-write)."""
    x, fixed = item
    for j in range(50):
        if x == POISON and j == 40 and not os.path.exists(fixed):
            raise ValueError(f"poison at record {j} of shard {x}")
        yield {"x": x, "j": j}


def visible_and_hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def read_jsonl_dir(directory: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(directory.glob("*.jsonl")) for line in p.read_text().splitlines()]


@pytest.fixture(params=["sync", "threadpool", pytest.param("ray", marks=pytest.mark.ray)])
def quarantining(request):
    """A backend of each kind that quarantines shards out of retries."""
    if request.param == "ray":
        request.getfixturevalue("ray_shared")
    b = create_backend(request.param, max_parallelism=4, progress=False, on_shard_failure="quarantine")
    yield b
    b.close()


def test_one_poison_shard_among_100_finishes_the_other_99_and_reports_it(quarantining, tmp_path):
    fixed = str(tmp_path / "fixed")
    out = tmp_path / "out"
    ds = Dataset.from_list([(x, fixed) for x in range(100)]).map(poisoned).write_jsonl(str(out / "part-{shard:05d}.jsonl"))
    execution = quarantining.execute(ds)
    with pytest.raises(QuarantinedShardsError) as raised:
        list(execution)
    (entry,) = raised.value.shards
    assert (entry["stage"], entry["shard"], entry["error_type"]) == (0, POISON, "ValueError")
    assert entry["message"] == f"poison record {POISON}" and "poison record" in entry["traceback"]
    assert entry["attempts"] == quarantining.max_user_retries + 1
    assert "stage 0, shard 37" in str(raised.value)
    # the other 99 finished, exactly; the poison shard left nothing, not even a temporary
    assert sorted(r["x"] for r in read_jsonl_dir(out)) == [x for x in range(100) if x != POISON]
    assert visible_and_hidden(out) == sorted([f"part-{x:05d}.jsonl" for x in range(100) if x != POISON] + [".zephyr-run.json"])
    # what list() could not return: the 99 written paths, in shard order
    assert raised.value.results == [str(out / f"part-{x:05d}.jsonl") for x in range(100) if x != POISON]
    # the report: the status snapshot and the run record
    snapshot = execution.status.snapshot()
    assert [(q["stage"], q["shard"]) for q in snapshot["quarantined"]] == [(0, POISON)]
    assert snapshot["stages"][0]["shards"]["quarantined"] == 1 and snapshot["stages"][0]["shards"]["done"] == 99
    record = read_run_record(str(out))
    assert record["state"] == "failed" and record["error"]["type"] == "QuarantinedShardsError"
    assert [(q["shard"], q["error_type"]) for q in record["quarantined"]] == [(POISON, "ValueError")]
    assert execution.stats[0].quarantined == 1


def die_on_poison(x):
    """Kills its worker process for x == POISON, every time (a shard that takes its worker down)."""
    if x == POISON:
        os._exit(1)
    return {"x": x}


@pytest.mark.ray
def test_a_shard_that_kills_its_worker_every_time_is_quarantined_on_ray(ray_shared, tmp_path):
    backend = create_backend("ray", max_parallelism=4, progress=False, on_shard_failure="quarantine",
                             ray_task_retries=0, max_infra_retries=1)
    from zephyr.execution.summary import format_summary

    summaries: list[str] = []
    backend.on_finish.append(lambda execution: summaries.append(format_summary(execution)))
    ds = Dataset.from_list([POISON - 1, POISON, POISON + 1]).map(die_on_poison).write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl"))
    with pytest.raises(QuarantinedShardsError) as raised:
        list(backend.execute(ds))
    (entry,) = raised.value.shards
    assert (entry["shard"], entry["error_type"], entry["attempts"]) == (1, "TaskLost", 2)
    # two attempts lost, one run again: the second was set aside, not retried
    assert "retried 0 failed / 1 lost" in summaries[0], summaries
    assert sorted(p.name for p in (tmp_path / "out").glob("p-*")) == ["p-0.jsonl", "p-2.jsonl"]


def test_quarantined_shards_error_keeps_its_results_when_pickled(tmp_path):
    """Regression: pickling (a pipeline run in a Ray task, e.g. a Marin step) dropped `.results`,
    the written paths that `list(execution)` cannot return once the error is raised."""
    fixed = str(tmp_path / "fixed")
    ds = Dataset.from_list([(x, fixed) for x in range(POISON - 1, POISON + 2)]).map(poisoned).write_jsonl(
        str(tmp_path / "out" / "p-{shard}.jsonl"))
    with pytest.raises(QuarantinedShardsError) as raised:
        list(create_backend("sync", progress=False, on_shard_failure="quarantine").execute(ds))
    copy = pickle.loads(pickle.dumps(raised.value))
    assert copy.results == [str(tmp_path / "out" / f"p-{i}.jsonl") for i in (0, 2)]
    assert copy.shards == raised.value.shards and str(copy) == str(raised.value)


def test_default_stays_fail_fast(tmp_path):
    fixed = str(tmp_path / "fixed")
    backend = create_backend("sync", progress=False)
    ds = Dataset.from_list([(x, fixed) for x in range(100)]).map(poisoned).write_jsonl(str(tmp_path / "out" / "p-{shard:05d}.jsonl"))
    with pytest.raises(ShardError) as raised:
        list(backend.execute(ds))
    assert not isinstance(raised.value, QuarantinedShardsError)
    assert len(list((tmp_path / "out").glob("p-*.jsonl"))) == POISON  # sync: stopped at the poison shard
    assert read_run_record(str(tmp_path / "out"))["quarantined"] == []


def test_bad_on_shard_failure_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="on_shard_failure must be one of 'fail', 'quarantine', got 'skip'"):
        create_backend("sync", on_shard_failure="skip")


def test_quarantined_writer_shard_leaves_no_partial_file_and_a_rerun_completes_it(tmp_path):
    fixed = tmp_path / "fixed"
    out = tmp_path / "out"
    ds = (Dataset.from_list([(x, str(fixed)) for x in range(40, 30, -1)]).flat_map(spread)
          .write_jsonl(str(out / "part-{shard:05d}.jsonl"), skip_existing=True))
    backend = create_backend("threadpool", max_parallelism=3, progress=False, on_shard_failure="quarantine")
    with pytest.raises(QuarantinedShardsError) as raised:
        list(backend.execute(ds))
    (entry,) = raised.value.shards
    assert entry["shard"] == 3 and entry["message"] == "poison at record 40 of shard 37"  # failed mid-write
    names = visible_and_hidden(out)
    assert "part-00003.jsonl" not in names and not any(n.startswith(".part-00003.jsonl") and "tmp" in n for n in names)
    fixed.touch()
    execution = backend.execute(ds)
    list(execution)
    assert execution.counters["zephyr/shards_skipped_existing"] == 9  # only the quarantined shard ran again
    oracle = sorted((x, j) for x in range(40, 30, -1) for j in range(50))
    assert sorted((r["x"], r["j"]) for r in read_jsonl_dir(out)) == oracle
    assert read_run_record(str(out))["state"] == "succeeded"


def of_day(item):
    """`item` is (x, day): shard 3 of day 2 is poison."""
    x, day = item
    if (x, day) == (3, 2):
        raise ValueError("poison on day 2")
    return {"x": x, "day": day}


def test_a_quarantined_writer_shard_leaves_no_output_of_an_earlier_run_at_its_path(quarantining, tmp_path):
    """Regression: day 2's quarantined shard 3 left day 1's part-3 in place, so the directory mixed
    an old output in among day 2's (zephyr verify: 'extra'); the shard must contribute nothing."""
    out = tmp_path / "out"

    def day(n):
        return Dataset.from_list([(x, n) for x in range(6)]).map(of_day).write_jsonl(str(out / "part-{shard}.jsonl"))

    list(quarantining.execute(day(1)))
    with pytest.raises(QuarantinedShardsError):
        list(quarantining.execute(day(2)))
    assert sorted((r["x"], r["day"]) for r in read_jsonl_dir(out)) == [(x, 2) for x in range(6) if x != 3]
    assert not verify_directory(str(out)).extra


def count_by_key(key, records):
    return {"key": key, "n": sum(1 for _ in records), "xs": sorted(r["x"] for r in records)}


def _counts(records) -> dict:
    return {r["key"]: (r["n"], r["xs"]) for r in records}


def _oracle(xs) -> dict:
    groups: dict = {}
    for x in xs:
        groups.setdefault(x % 7, []).append(x)
    return {k: (len(v), sorted(v)) for k, v in groups.items()}


@pytest.mark.parametrize("skip_existing", [False, True])
def test_shuffle_with_a_quarantined_map_shard_is_the_oracle_over_the_others_and_a_fixed_rerun_the_whole(tmp_path, skip_existing):
    fixed = tmp_path / "fixed"
    out = tmp_path / "out"
    xs = list(range(30, 50))
    ds = (Dataset.from_list([(x, str(fixed)) for x in xs]).map(poisoned)
          .group_by(lambda r: r["key"], lambda k, rs: count_by_key(k, list(rs)), num_output_shards=3)
          .write_jsonl(str(out / "part-{shard:05d}.jsonl"), skip_existing=skip_existing))
    backend = create_backend("threadpool", max_parallelism=4, progress=False, on_shard_failure="quarantine")
    with pytest.raises(QuarantinedShardsError):
        list(backend.execute(ds))
    assert _counts(read_jsonl_dir(out)) == _oracle([x for x in xs if x != POISON])
    fixed.touch()
    execution = backend.execute(ds)
    list(execution)
    assert execution.counters["zephyr/map_shards_resumed"] == len(xs) - 1  # only the quarantined map shard ran again
    # the reduce outputs made without shard 37 are not taken for complete ones (skip_existing provenance)
    assert _counts(read_jsonl_dir(out)) == _oracle(xs)


def total_by_parity(parity, records):
    return {"parity": parity, "n": sum(r["n"] for r in records)}


def test_a_later_shuffle_after_a_quarantine_is_not_resumed_by_the_fixed_rerun(tmp_path):
    """Stage 1's map output was made without the quarantined shard: a rerun must not reuse it."""
    fixed = tmp_path / "fixed"
    xs = list(range(30, 50))
    ds = (Dataset.from_list([(x, str(fixed)) for x in xs]).map(poisoned)
          .group_by(lambda r: r["key"], lambda k, rs: count_by_key(k, list(rs)), num_output_shards=3)
          .group_by(lambda r: r["key"] % 2, total_by_parity, num_output_shards=2)
          .write_jsonl(str(tmp_path / "out" / "part-{shard:05d}.jsonl")))
    backend = create_backend("sync", progress=False, on_shard_failure="quarantine")
    with pytest.raises(QuarantinedShardsError):
        list(backend.execute(ds))
    partial = {r["parity"]: r["n"] for r in read_jsonl_dir(tmp_path / "out")}
    assert partial == dict(Counter((x % 7) % 2 for x in xs if x != POISON))
    fixed.touch()
    list(backend.execute(ds))
    assert {r["parity"]: r["n"] for r in read_jsonl_dir(tmp_path / "out")} == dict(Counter((x % 7) % 2 for x in xs))


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.integers(0, 60), min_size=1, max_size=12), poison=st.integers(0, 11), partitions=st.integers(1, 4))
def test_property_group_by_with_one_quarantined_map_shard_equals_the_oracle_over_the_other_shards(values, poison, partitions):
    """Map shard `poison` (if it exists) raises; the reduce sees exactly the other shards' records."""
    shards = [[(i, v) for v in values[i::3]] for i in range(min(3, len(values)))]
    ds = (Dataset.from_list(shards).flat_map(lambda shard: [_raise_in(shard, poison) for _ in (0,)][0])
          .group_by(lambda r: r["v"] % 5, lambda k, rs: {"k": k, "vs": sorted(r["v"] for r in rs)}, num_output_shards=partitions))
    backend = create_backend("sync", progress=False, on_shard_failure="quarantine")
    results: list = []
    execution = backend.execute(ds)
    try:
        results.extend(execution)
    except QuarantinedShardsError as e:
        assert [q["shard"] for q in e.shards] == [poison]
    kept = [v for i, shard in enumerate(shards) if i != poison for _, v in shard]
    oracle: dict = {}
    for v in kept:
        oracle.setdefault(v % 5, []).append(v)
    assert {r["k"]: r["vs"] for r in results} == {k: sorted(vs) for k, vs in oracle.items()}


def _raise_in(shard, poison):
    if shard and shard[0][0] == poison:
        raise ValueError(f"poison shard {poison}")
    return [{"v": v} for _, v in shard]


QUARANTINE_SCRIPT = textwrap.dedent(
    """
    import sys
    from zephyr import Dataset, flow_backend
    def check(x):
        if x == 3:
            raise ValueError(f"bad value {x}")
        return {"x": x}
    if __name__ == "__main__":
        out = sys.argv[1]
        list(flow_backend().execute(Dataset.from_list(list(range(6))).map(check).write_jsonl(out + "/p-{shard}.jsonl")))
    """
)


@pytest.mark.parametrize("option, code", [(["--on-shard-failure=quarantine"], 3), ([], 1)])
def test_command_line_quarantine_exits_non_zero_with_the_report(tmp_path, option, code):
    path = tmp_path / "script.py"
    path.write_text(QUARANTINE_SCRIPT)
    result = subprocess.run([sys.executable, "-m", "zephyr", "--backend=sync", *option, str(path), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == code, result.stderr
    if option:
        assert "QuarantinedShardsError: 1 shard(s) quarantined" in result.stderr
        assert "stage 0, shard 3 (source: 3): ValueError: bad value 3" in result.stderr
        assert "QUARANTINED 1 shard(s)" in result.stderr  # the summary's report
        assert sorted(p.name for p in (tmp_path / "out").glob("p-*")) == [f"p-{i}.jsonl" for i in (0, 1, 2, 4, 5)]
    else:
        assert "ShardError: stage 0, shard 3" in result.stderr


def fails_on_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return {"x": x}


def test_a_stage_past_max_quarantined_stops_the_run_naming_the_limit(tmp_path):
    """Half of the shards fail: the code, not a few inputs, is at fault; the run stops at the second."""
    backend = create_backend("sync", progress=False, on_shard_failure="quarantine")  # default: 10%, at least one
    out = tmp_path / "out"
    with pytest.raises(QuarantineLimitError, match=r"stage 0: 2 of its 10 shards failed on every attempt, more than "
                                                   r"max_quarantined allows \(1\).*shard 3 .*ValueError: odd 3") as caught:
        list(backend.execute(Dataset.from_list(list(range(10))).map(fails_on_odd).write_jsonl(str(out / "p-{shard}.jsonl"))))
    assert [q["shard"] for q in caught.value.shards] == [1]  # the one set aside before the limit
    assert sorted(p.name for p in out.glob("p-*.jsonl")) == ["p-0.jsonl", "p-2.jsonl"]  # sync: nothing ran after shard 3
    assert read_run_record(str(out))["state"] == "failed"


@pytest.mark.parametrize("limit, shards", [(5, 5), (None, 5), (0.5, 5)])
def test_max_quarantined_as_a_count_a_fraction_or_none_lets_the_run_finish(tmp_path, limit, shards):
    backend = create_backend("threadpool", max_parallelism=4, progress=False, on_shard_failure="quarantine",
                             max_quarantined=limit)
    out = tmp_path / "out"
    with pytest.raises(QuarantinedShardsError) as caught:
        list(backend.execute(Dataset.from_list(list(range(10))).map(fails_on_odd).write_jsonl(str(out / "p-{shard}.jsonl"))))
    backend.close()
    assert [q["shard"] for q in caught.value.shards] == [1, 3, 5, 7, 9][:shards]
    assert read_jsonl_dir(out) == [{"x": x} for x in range(0, 10, 2)]


@pytest.mark.parametrize("bad", [-1, 1.5, 0.0, True, "10%"])
def test_a_bad_max_quarantined_is_refused_saying_what_is_accepted(bad):
    with pytest.raises(ValueError, match="max_quarantined must be None, a number of shards >= 0, or a fraction in"):
        create_backend("sync", on_shard_failure="quarantine", max_quarantined=bad)


def test_the_command_line_reads_max_quarantined_as_a_count_a_fraction_or_none():
    import argparse

    from zephyr.cli import _max_quarantined

    assert _max_quarantined("5") == 5 and _max_quarantined("0.02") == 0.02 and _max_quarantined("none") is None
    with pytest.raises(argparse.ArgumentTypeError, match="expected a count"):
        _max_quarantined("lots")


def test_the_summary_of_a_quarantining_run_names_its_run_record(tmp_path):
    """Regression: the end-of-run summary (printed by `zephyr` when the run finishes) of a run
    with a quarantined shard had no "run record:" line: the record was written only later, when
    QuarantinedShardsError was raised, though this is the run whose record one wants to read."""
    from zephyr.execution.summary import format_summary

    backend = create_backend("sync", progress=False, on_shard_failure="quarantine")
    summaries: list[str] = []
    backend.on_finish.append(lambda execution: summaries.append(format_summary(execution)))
    out = tmp_path / "out"
    execution = backend.execute(Dataset.from_list(list(range(6))).map(fails_on_odd_3).write_jsonl(str(out / "p-{shard}.jsonl")))
    with pytest.raises(QuarantinedShardsError) as raised:
        list(execution)
    assert len(raised.value.results) == 5
    [summary] = summaries
    assert f"run record: {out / '.zephyr-run.json'}" in summary and "QUARANTINED 1 shard(s)" in summary
    record = read_run_record(str(out))
    assert record["state"] == "failed" and record["error"]["type"] == "QuarantinedShardsError"
    assert [(q["stage"], q["shard"]) for q in record["quarantined"]] == [(0, 3)] and len(record["outputs"]) == 5
    verification = verify_directory(str(out))
    assert not verification.ok
    # the five outputs match: the verdict says the run is what fails, not "0 problem(s)"
    assert "does not verify: the 5 recorded output(s) match, but the recorded run did not succeed" in verification.describe()
    assert "0 problem(s)" not in verification.describe()


def fails_on_odd_3(x):
    if x == 3:
        raise ValueError("bad value 3")
    return {"x": x}
