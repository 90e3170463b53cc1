"""Second attempts of straggling shards (issue 41, `zephyr.execution.speculation`).

Three layers: the policy alone (`Stragglers`, `Speculation`) with times passed in; the stage loop
on a task pool with a fake clock (`ClockPool`: each call's duration is scripted, so when the
copy starts and when the stage ends are exact); and whole pipelines on the threadpool backend
where one shard's first attempt really hangs until it is cancelled (`_hangs_first`), checked
against plain-Python oracles. The multi-node Ray test is test_stragglers_ray.py; the page's
rendering of second attempts is in test_status_browser.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from zephyr import Dataset, ZephyrContext, counters, create_backend
from zephyr.execution.pool import run_inline
from zephyr.execution.provenance import claim_output, shard_source, sidecar_path, writer_codes
from zephyr.execution.speculation import OFF, Speculation, Stragglers, speculation_option
from zephyr.execution.stage_loop import StageLoop, StageStats
from zephyr.plan import ops as op
from zephyr.plan.compile import compile_plan
from zephyr.execution.summary import format_summary
from zephyr.status import RECORD_NAME, format_snapshot
from zephyr.tasks import ShardTask, StageProgram

HANG_DEADLINE = 120.0  # a first attempt that is never cancelled gives up after this (the test then fails)
EAGER = Speculation(multiplier=2.0, min_seconds=0.3, fraction_done=0.5)


# ---- the policy -----------------------------------------------------------------------------------


def test_the_threshold_is_a_multiple_of_the_median_but_never_below_min_seconds():
    import random
    import statistics

    def threshold(durations):
        watch = Stragglers(Speculation(multiplier=3.0, min_seconds=10.0, fraction_done=0.0), num_shards=len(durations))
        for elapsed in durations:
            watch.finished(elapsed)
        return watch.threshold()

    assert threshold([30.0, 1.0, 2.0]) == 10.0  # 3 x median 2.0 = 6 < 10
    assert threshold([100.0, 5.0, 6.0]) == 18.0  # 3 x median 6.0, the one slow peer ignored
    assert threshold([4.0, 100.0, 5.0, 6.0]) == 16.5  # an even count: the mean of the middle two
    rng = random.Random(7)
    for n in (1, 2, 5, 100, 1001):  # oracle: the standard library's median
        durations = [rng.expovariate(0.1) for _ in range(n)]
        assert threshold(durations) == pytest.approx(max(10.0, 3.0 * statistics.median(durations)))


def test_nothing_is_a_straggler_before_the_fraction_of_the_stage_is_done():
    watch = Stragglers(Speculation(multiplier=2.0, min_seconds=1.0, fraction_done=0.75), num_shards=8)
    running = {"a": (6, 0.0), "b": (7, 50.0)}
    for _ in range(5):
        watch.finished(1.0)
    assert watch.threshold() is None and watch.overdue(100.0, running) == []  # 5 of 8 < 75%
    watch.finished(1.0)
    assert watch.threshold() == 2.0
    assert watch.overdue(100.0, running) == ["a", "b"]  # longest-running first
    assert watch.overdue(51.0, running) == ["a"]  # b has run 1 s: not past 2 s
    watch.copied.add(6)
    assert watch.overdue(100.0, running) == ["b"]  # a shard is copied once


def test_resumed_and_set_aside_shards_count_as_done_but_give_no_run_time():
    watch = Stragglers(Speculation(min_seconds=0.0, fraction_done=0.5), num_shards=4, done=2)
    assert watch.threshold() is None  # half done, but no finished run time to compare with
    watch.finished(None)  # quarantined
    watch.finished(4.0)
    assert watch.done == 4 and watch.threshold() == 12.0


def test_disabled_speculation_never_names_a_straggler():
    watch = Stragglers(OFF, num_shards=2)
    watch.finished(1.0)
    assert watch.threshold() is None and watch.overdue(1e9, {"a": (1, 0.0)}) == []


@pytest.mark.parametrize("value, expected", [
    (None, Speculation()), (True, Speculation()), (False, OFF), ("off", OFF), ("on", Speculation()),
    ({"multiplier": 2}, Speculation(multiplier=2.0)),
    ("multiplier=2, min_seconds=5,fraction_done=0.5", Speculation(multiplier=2.0, min_seconds=5.0, fraction_done=0.5)),
    ("enabled=off", OFF),
])
def test_speculation_options_in_every_form(value, expected, monkeypatch):
    monkeypatch.delenv("ZEPHYR_SPECULATION", raising=False)
    assert speculation_option(value) == expected


def test_the_environment_variable_sets_the_default(monkeypatch):
    monkeypatch.setenv("ZEPHYR_SPECULATION", "min_seconds=2")
    assert create_backend("threadpool", progress=False).speculation == Speculation(min_seconds=2.0)
    monkeypatch.setenv("ZEPHYR_SPECULATION", "off")
    assert not create_backend("threadpool", progress=False).speculation.enabled
    monkeypatch.setenv("ZEPHYR_SPECULATION", "multiplier=fast")
    with pytest.raises(ValueError, match=r"\$ZEPHYR_SPECULATION='multiplier=fast': multiplier must be a number"):
        create_backend("threadpool", progress=False)


@pytest.mark.parametrize("value, message", [
    ({"multiplier": 0.5}, "multiplier must be >= 1"),
    ({"fraction_done": 1.0}, r"fraction_done must be in \[0, 1\)"),
    ({"min_secs": 3}, "unknown setting.*min_secs.*choose from enabled, fraction_done, min_seconds, multiplier"),
    ("sometimes", "expected 'on', 'off' or name=value settings"),
])
def test_bad_speculation_options_are_refused_naming_the_setting(value, message):
    with pytest.raises(ValueError, match=message):
        create_backend("threadpool", speculation=value)
    with pytest.raises(ValueError, match=message):
        ZephyrContext(client="threadpool", speculation=value)


def test_the_sync_backend_never_copies_a_shard():
    assert not create_backend("sync", speculation=True).speculation.enabled


# ---- the stage loop, on a fake clock ----------------------------------------------------------------


class _Call:
    def __init__(self, shard, attempt, start, end, finished, copy):
        self.shard, self.attempt, self.start, self.end, self.finished, self.copy = shard, attempt, start, end, finished, copy
        self.cancelled = False


class ClockPool:
    """A task pool on a fake clock: a call (shard, attempt) takes `durations[(shard, attempt)]`
    seconds (1 by default); `wait` moves the clock on, at most 0.5 s at a time (the runner's wait
    slice), to the next end. Each call really runs `run_shard` when submitted. A cancel ends the
    call at once, unless `cancel_lands=False` (a loser that finishes anyway). Results carry their
    scripted run time as `elapsed`."""

    def __init__(self, durations: dict, speculation: Speculation = EAGER, max_parallelism: int = 4, cancel_lands: bool = True):
        self.now = 0.0
        self.durations = durations
        self.speculation = speculation
        self.max_parallelism = max_parallelism
        self.max_user_retries, self.max_infra_retries, self.retry_backoff = 0, 3, 0.0
        self.cancel_lands = cancel_lands
        self.attempts: Counter = Counter()
        self.calls: list[_Call] = []
        self.most_in_flight = 0

    def clock(self) -> float:
        return self.now

    def share(self, obj):
        return obj

    def submit(self, fn, shared, task, copy=False):
        self.attempts[task.shard] += 1
        n = self.attempts[task.shard]
        call = _Call(task.shard, n, self.now, self.now + self.durations.get((task.shard, n), 1.0), run_inline(fn, shared, task), copy)
        self.calls.append(call)
        self.most_in_flight = max(self.most_in_flight, sum(1 for c in self.calls if c.end > self.now))
        return call

    def submit_again(self, fn, shared, task, first):
        return self.submit(fn, shared, task, copy=True)

    def running_since(self, handles):
        return None

    def wait(self, handles, timeout=None):
        end = min(h.end for h in handles)
        if end > self.now:
            self.now = min(end, self.now + (0.5 if timeout is None else min(timeout, 0.5)))
        return [h for h in handles if h.end <= self.now]

    def result(self, handle):
        result = handle.finished.get()
        result.elapsed = handle.end - handle.start  # its run time on this clock, as a worker would measure it
        return result

    def cancel(self, handles):
        for handle in handles:
            handle.cancelled = True
            if self.cancel_lands:
                handle.end = self.now

    def drain(self, handles, timeout=120.0):
        pass


def _counting_stage(n: int):
    def double(x):
        counters.increment("docs")
        return x * 2

    program = StageProgram(0, (op.Map(double),))
    return program, [ShardTask(0, i, n, f"shard {i}", (i, i + 100)) for i in range(n)]


def _run_loop(pool: ClockPool, n: int = 8):
    program, tasks = _counting_stage(n)
    stats, totals = StageStats(0, "map", n), Counter()
    progress = type("P", (), {"update": lambda self, r: None, "close": lambda self: None})()
    results = list(StageLoop(pool, program, tasks, {}, stats, totals, progress, clock=pool.clock))
    assert [r.items for r in results] == [[2 * i, 2 * (i + 100)] for i in range(n)]  # oracle: doubled inputs
    assert totals["docs"] == 2 * n  # each shard counted once
    return stats, pool.now


def test_a_straggler_is_copied_once_past_its_threshold_and_the_copy_ends_the_stage():
    # 8 shards of 1 s, 4 at a time; shard 7's first attempt would take 100 s
    pool = ClockPool({(7, 1): 100.0})
    stats, ended = _run_loop(pool)
    first, copy = [c for c in pool.calls if c.shard == 7]
    # half done at t=1 (threshold 2 x median 1 s = 2 s); shard 7 started at t=1, so it is late after
    # t=3, seen at the next 0.5 s wake-up
    assert first.start == 1.0 and copy.copy and 3.0 < copy.start <= 3.5
    assert ended == copy.start + 1.0  # the copy's 1 s, not the first attempt's 100 s
    assert first.cancelled and not copy.cancelled
    assert (stats.speculated, stats.won_by_copy) == (1, 1)
    assert pool.most_in_flight <= 4  # the copy took a free slot of the window


def test_without_speculation_the_stage_waits_for_its_straggler():
    pool = ClockPool({(7, 1): 100.0}, speculation=OFF)
    stats, ended = _run_loop(pool)
    assert ended == 101.0 and stats.speculated == 0 and pool.attempts[7] == 1


def test_when_both_attempts_finish_the_first_one_seen_wins_and_the_other_is_dropped():
    # the first attempt ends at the same moment as its copy: both come back in one wait
    pool = ClockPool({(7, 1): 3.5, (7, 2): 1.0})
    stats, _ = _run_loop(pool)  # the oracle inside checks each shard's counters are taken once
    first, copy = [c for c in pool.calls if c.shard == 7]
    assert first.end == copy.end == 4.5
    assert (stats.speculated, stats.won_by_copy) == (1, 0) and copy.cancelled


def test_a_loser_that_ignores_its_cancel_is_dropped_when_it_finishes():
    pool = ClockPool({(7, 1): 6.0}, cancel_lands=False)
    stats, ended = _run_loop(pool)
    first, copy = [c for c in pool.calls if c.shard == 7]
    assert first.cancelled and ended == copy.end < first.end  # the stage did not wait for it
    assert stats.won_by_copy == 1


def test_no_copy_while_shards_wait_for_a_slot():
    # shard 1 is slow, but shards are still pending: they get the free slots first
    pool = ClockPool({(1, 1): 20.0}, max_parallelism=2, speculation=Speculation(multiplier=2.0, min_seconds=0.1, fraction_done=0.0))
    _run_loop(pool, n=8)
    copy = next(c for c in pool.calls if c.copy)
    last_first_attempt = max(c.start for c in pool.calls if not c.copy)
    # shard 7, the last to start (t=6), frees a slot at t=7: the copy takes it then, not before
    assert copy.shard == 1 and last_first_attempt == 6.0 and copy.start == 7.0


# ---- pipelines on the threadpool backend ------------------------------------------------------------


def _hangs_first(item):
    """Shard `i` of 8; the first attempt of shard `slow` is slow as `mode` says (`_hold`), and in
    mode "first-wins" its second attempt hangs, in "copy-fails" it raises; every other attempt
    takes ~50 ms. Each attempt leaves markers: start, then end or raised (its exception: a
    cancel, or its own). Counts `docs` per record it yields, in every attempt."""
    events, i, slow, mode = item
    attempt = sum(1 for name in os.listdir(events) if name.startswith(f"start-{i}-")) + 1
    Path(events, f"start-{i}-{attempt}").touch()
    try:
        if i == slow and attempt == 1:
            _hold(events, i, mode)
        elif i == slow and mode == "copy-fails":
            raise ValueError(f"the second attempt of shard {i} fails")
        elif i == slow and mode == "first-wins":
            _wait_for(Path(events, "release"))  # never opened: the copy hangs until cancelled
        else:
            time.sleep(0.05)
        for j in range(5):
            counters.increment("docs")
            yield {"shard": i, "j": j, "text": f"doc {i}-{j}"}
    except BaseException as e:
        Path(events, f"raised-{i}-{attempt}").write_text(type(e).__name__)
        raise
    Path(events, f"end-{i}-{attempt}").touch()


def _hold(events, i, mode):
    if mode == "first-wins":  # run until the copy has started, then finish first
        _wait_for(Path(events, f"start-{i}-2"))
    else:  # "hang" (until cancelled), or until the test opens the gate
        _wait_for(Path(events, "release"))


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + HANG_DEADLINE
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} never appeared")
        time.sleep(0.01)


def _oracle(n: int) -> list[dict]:
    return [{"shard": i, "j": j, "text": f"doc {i}-{j}"} for i in range(n) for j in range(5)]


def _events(path: Path) -> set[str]:
    return set(os.listdir(path))


def _pipeline(events: Path, n: int, slow: int, mode: str):
    return Dataset.from_list([(str(events), i, slow, mode) for i in range(n)]).flat_map(_hangs_first)


def _read_jsonl(paths) -> list[dict]:
    import zstandard

    rows = []
    for path in paths:
        data = Path(path).read_bytes()
        text = zstandard.ZstdDecompressor().decompressobj().decompress(data) if str(path).endswith(".zst") else data
        rows.extend(json.loads(line) for line in text.decode().splitlines())
    return rows


def test_a_hanging_shard_is_copied_and_the_copy_wins_outputs_and_counters_once(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    out = tmp_path / "out"
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=EAGER)
    try:
        execution = backend.execute(_pipeline(events, 8, 5, "hang").write_jsonl(f"{out}/part-{{shard:02d}}.jsonl"))
        paths = list(execution)
    finally:
        backend.close()
    seen = _events(events)
    # the slowness landed: shard 5's first attempt started, never ended, and was cancelled
    assert {"start-5-1", "raised-5-1"} <= seen and "end-5-1" not in seen
    assert (events / "raised-5-1").read_text() == "Cancelled"  # by the runner, not by its deadline
    assert {"start-5-2", "end-5-2"} <= seen and "start-5-3" not in seen  # one copy, which finished
    assert not any(name.startswith("start-") and name != "start-5-2" and name.endswith("-2") for name in seen)
    assert sorted(_read_jsonl(paths), key=lambda r: (r["shard"], r["j"])) == _oracle(8)
    assert sorted(os.listdir(out)) == [RECORD_NAME] + [f"part-{i:02d}.jsonl" for i in range(8)]  # one file each, no litter
    assert execution.counters["docs"] == 40  # the first attempt's records, counted as it ran, were dropped
    assert (execution.stats[0].speculated, execution.stats[0].won_by_copy) == (1, 1)
    record = orjson.loads((out / RECORD_NAME).read_bytes())
    (copy,) = record["stages"][0]["second_attempts"]
    assert (copy["shard"], copy["first_attempt"], copy["second_attempt"], copy["winner"], copy["won_by"]) == (5, 1, 2, 2, "second")
    assert copy["ran_s"] > copy["threshold_s"] >= 0.3 and record["speculation"].startswith("past 2x the median")
    assert record["counters"]["docs"] == 40 and record["stages"][0]["shards"]["cancelled"] == 0
    assert {o["path"]: o["records"] for o in record["outputs"]} == {f"part-{i:02d}.jsonl": 5 for i in range(8)}
    # said in `zephyr status` and in the end-of-run summary
    assert "stage 0 shard 5: copied after" in format_snapshot(record) and "attempt 2 (the second) won" in format_snapshot(record)
    assert "1 straggler(s) given a second attempt (1 won by it)" in format_summary(execution)


def test_when_the_first_attempt_finishes_first_the_copy_is_cancelled(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=EAGER)
    try:
        execution = backend.execute(_pipeline(events, 8, 5, "first-wins"))
        rows = list(execution)
    finally:
        backend.close()
    seen = _events(events)
    assert {"start-5-1", "end-5-1", "start-5-2", "raised-5-2"} <= seen and "end-5-2" not in seen
    assert (events / "raised-5-2").read_text() == "Cancelled"
    assert sorted(rows, key=lambda r: (r["shard"], r["j"])) == _oracle(8) and execution.counters["docs"] == 40
    assert (execution.stats[0].speculated, execution.stats[0].won_by_copy) == (1, 0)
    (copy,) = execution.status.snapshot()["stages"][0]["second_attempts"]
    assert (copy["winner"], copy["won_by"]) == (1, "first")


def test_a_failing_copy_is_left_to_the_first_attempt_and_charged_nothing(tmp_path, wait_until):
    events = tmp_path / "events"
    events.mkdir()
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=EAGER, max_user_retries=0)
    outcome: dict = {}
    execution = backend.execute(_pipeline(events, 8, 5, "copy-fails"))
    # with no user retries, a failure charged to the shard would end the run
    driver = threading.Thread(target=lambda: outcome.setdefault("rows", list(execution)), daemon=True)
    driver.start()
    try:  # the first attempt goes on once the runner has seen its copy fail
        wait_until(lambda: execution.status.snapshot()["failures_total"] == 1, "the second attempt's failure")
    finally:
        (events / "release").touch()
        driver.join(timeout=HANG_DEADLINE)
        backend.close()
    rows = outcome["rows"]
    assert {"start-5-2", "raised-5-2", "end-5-1"} <= _events(events)  # the copy failed; the first finished
    assert (events / "raised-5-2").read_text() == "ValueError"
    assert sorted(rows, key=lambda r: (r["shard"], r["j"])) == _oracle(8) and execution.counters["docs"] == 40
    assert execution.stats[0].retries_user == 0
    snapshot = execution.status.snapshot()
    (failure,) = snapshot["failures"]
    assert (failure["shard"], failure["attempt"], failure["outcome"], failure["error_type"]) == (5, 2, "superseded", "ValueError")
    (copy,) = snapshot["stages"][0]["second_attempts"]
    assert (copy["winner"], copy["failed_attempts"]) == (1, [2])


def test_with_speculation_off_the_stage_waits_for_its_straggler(tmp_path, wait_until):
    events = tmp_path / "events"
    events.mkdir()
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=False)
    outcome: dict = {}
    execution = backend.execute(_pipeline(events, 8, 5, "gate"))
    driver = threading.Thread(target=lambda: outcome.setdefault("rows", list(execution)), daemon=True)
    driver.start()
    try:
        wait_until(lambda: sum(name.startswith("end-") for name in _events(events)) == 7, "the 7 other shards to finish")
        time.sleep(1.0)  # > 3x EAGER's threshold: a copy would have started by now
        assert "start-5-2" not in _events(events) and driver.is_alive()
    finally:
        (events / "release").touch()
        driver.join(timeout=HANG_DEADLINE)
        backend.close()
    assert len(outcome["rows"]) == 40 and execution.stats[0].speculated == 0


def test_a_slow_map_shard_of_a_shuffle_is_copied_and_the_groups_are_exact(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=EAGER)
    try:
        execution = backend.execute(_pipeline(events, 8, 2, "hang").group_by(lambda r: r["j"], lambda k, rs: (k, sorted(r["shard"] for r in rs)), num_output_shards=3))
        groups = dict(execution)
    finally:
        backend.close()
    assert {"raised-2-1", "end-2-2"} <= _events(events)
    assert groups == {j: list(range(8)) for j in range(5)}  # oracle: every shard's record j, once
    assert execution.counters["docs"] == 40 and execution.counters["zephyr/shuffle_records"] == 40
    assert execution.stats[0].won_by_copy == 1


def test_skip_existing_outputs_of_a_copied_shard_are_kept_by_the_next_run(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    out = tmp_path / "out"
    pattern = f"{out}/part-{{shard:02d}}.jsonl"
    backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=EAGER)
    try:
        first = backend.execute(_pipeline(events, 8, 5, "hang").write_jsonl(pattern, skip_existing=True))
        list(first)
        assert first.stats[0].won_by_copy == 1 and "raised-5-1" in _events(events)
        again = backend.execute(_pipeline(events, 8, 5, "hang").write_jsonl(pattern, skip_existing=True))
        paths = list(again)
    finally:
        backend.close()
    # every output current, with its provenance: nothing ran again
    assert again.counters["zephyr/stages_skipped_outputs_exist"] == 0 and again.counters["zephyr/shards_skipped_existing"] == 8
    assert sorted(_read_jsonl(paths), key=lambda r: (r["shard"], r["j"])) == _oracle(8)
    assert orjson.loads(Path(sidecar_path(f"{out}/part-05.jsonl")).read_bytes())["sizes"]


def test_a_late_attempt_claiming_a_finished_output_leaves_it_in_place(tmp_path):
    """Regression: `claim_output` removed the output before writing its sidecar, so the losing
    attempt of a copied shard (one that reached its writer after the winner had written) deleted
    the winner's output; if it was then cancelled, the shard's output was gone."""
    out = tmp_path / "out"
    ds = Dataset.from_list([1, 2, 3]).map(lambda x: {"x": x}).write_jsonl(f"{out}/part-{{shard:02d}}.jsonl", skip_existing=True)
    backend = create_backend("sync", progress=False)
    try:
        list(backend.execute(ds))
    finally:
        backend.close()
    written = (out / "part-01.jsonl").read_bytes()
    stage = compile_plan(ds).stages[-1]
    ((index, code),) = writer_codes(stage)
    # what the losing attempt does as it reaches the writer: claim the output it is about to write
    claim_output(stage.ops[index], f"{out}/part-01.jsonl", shard_source([stage], stage, 1, 3), code)
    assert (out / "part-01.jsonl").read_bytes() == written
    assert orjson.loads(Path(sidecar_path(f"{out}/part-01.jsonl")).read_bytes())["sizes"]  # its record of sizes kept


@pytest.mark.slow
def test_the_default_policy_copies_a_shard_hanging_past_ten_seconds(tmp_path, monkeypatch):
    monkeypatch.delenv("ZEPHYR_SPECULATION", raising=False)  # the test session turns it off
    events = tmp_path / "events"
    events.mkdir()
    backend = create_backend("threadpool", max_parallelism=4, progress=False)
    try:
        execution = backend.execute(_pipeline(events, 8, 5, "hang"))
        rows = list(execution)
    finally:
        backend.close()
    assert (events / "raised-5-1").read_text() == "Cancelled" and "end-5-2" in _events(events)
    assert sorted(rows, key=lambda r: (r["shard"], r["j"])) == _oracle(8)
    (copy,) = execution.status.snapshot()["stages"][0]["second_attempts"]
    assert copy["threshold_s"] == 10.0 and copy["ran_s"] > 10.0 and copy["won_by"] == "second"


def test_zephyr_context_takes_the_option(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    with ZephyrContext(client="threadpool", max_workers=4, speculation=EAGER) as ctx:
        outcome = ctx.execute(_pipeline(events, 8, 5, "hang"))
    assert (events / "raised-5-1").read_text() == "Cancelled" and "end-5-2" in _events(events)
    assert sorted(outcome.results, key=lambda r: (r["shard"], r["j"])) == _oracle(8) and outcome.counters["docs"] == 40
