"""The status page's JSON during a real Ray run: it matches what the runner knows, and is final at the end.

The pipeline's shards wait at gates (files the test creates), one worker dies on its first
attempt (a lost task) and one shard raises once (a user error, retried), so the snapshot is
taken in a known state with every kind of shard in it.
"""

from __future__ import annotations

import threading

import pytest

from zephyr import Dataset, create_backend
from zephyr.status import read_run_record, start_dashboard
from zephyr.status.terminal import format_snapshot

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_snapshot_during_a_ray_run_matches_the_runner_and_is_final_at_the_end(ray_shared, tmp_path, gates, wait_until, http_json):
    ds = (Dataset.from_list(gates.items(8, {1: "die", 3: "raise"})).map(gates.fn)
          .group_by(lambda r: r["parity"], lambda k, rs: {"parity": k, "n": sum(1 for _ in rs)}, num_output_shards=2)
          .write_jsonl(str(tmp_path / "out" / "part-{shard}.jsonl")))
    # half a CPU per task: the 3 tasks in flight all run on the 2 CPUs, so shards held at their gates can
    # never keep a retried shard (whose gate is open) from a CPU. ray_task_retries=0: a dead worker reaches the runner.
    backend = create_backend("ray", max_parallelism=3, num_cpus=0.5, progress=False, ray_task_retries=0)
    dashboard = start_dashboard()
    execution = backend.execute(ds)
    results: list = []
    driver = threading.Thread(target=lambda: results.extend(execution), daemon=True)
    driver.start()
    try:
        gates.open(*range(4))
        api = dashboard.url + "api/snapshot"

        def settled():  # shards 0-3 done and counted, 4-6 fill the window, 7 waits
            s = http_json(api)
            st = s["stages"][0] if s["run_id"] == execution.status.run_id else None
            ok = st and st["shards"]["done"] == 4 and st["shards"]["running"] == 3 and s["counters"].get("docs/weight") == 6
            return s if ok else None

        s = wait_until(settled, "4 shards done and 3 in flight")
        assert s["state"] == "running"
        first, second = s["stages"]
        stats = execution.stats[0]
        assert first["state"] == "running" and first["num_shards"] == 8
        assert first["shards"]["queued"] == 1 and first["shards"]["failed"] == 0
        assert first["shards"]["lost"] == stats.retries_lost == 1 and first["shards"]["retried_lost"] == 1
        assert first["shards"]["user_errors"] == 1 and first["shards"]["retried_user"] == stats.retries_user == 1
        assert sorted(g["shard"] for g in first["stragglers"]) == [4, 5, 6]
        assert all(g["attempt"] == 1 and g["elapsed_s"] >= 0 for g in first["stragglers"])
        # counters: what the runner has accepted so far (the lost and failed attempts' counts are dropped)
        assert s["counters"] == dict(execution.counters)
        assert s["counters"]["docs/seen"] == 4 and s["counters"]["zephyr/shuffle_records"] == 4
        assert first["items_in"] == 4 and first["items_out"] == 4
        assert second["state"] == "waiting" and second["shards"]["done"] == 0 and second["shards"]["queued"] == 2
        failures = {f["kind"]: f for f in s["failures"]}
        assert set(failures) == {"lost", "user_error"} and s["failures_total"] == 2
        assert failures["lost"]["shard"] == 1 and failures["lost"]["outcome"] == "retried"
        assert "WorkerCrashedError" in failures["lost"]["message"] or "died" in failures["lost"]["message"]
        assert failures["user_error"]["shard"] == 3 and failures["user_error"]["error_type"] == "ValueError"
        assert failures["user_error"]["message"] == "bad record in item 3: unterminated string" and "in gated" in failures["user_error"]["traceback"]

        gates.open(*range(4, 8))
        driver.join(timeout=120)
        assert not driver.is_alive() and len(results) == 2

        final = http_json(api + f"?run={execution.status.run_id}")
        assert final["state"] == "succeeded" and final["error"] is None
        for st, stats in zip(final["stages"], execution.stats):
            assert st["state"] == "done"
            assert st["shards"]["done"] == st["num_shards"] == stats.num_shards
            assert st["shards"]["running"] == st["shards"]["queued"] == st["shards"]["failed"] == 0
            assert st["shards"]["retried_user"] == stats.retries_user and st["shards"]["lost"] == stats.retries_lost
            assert st["stragglers"] == []
        assert final["counters"] == dict(execution.counters)
        assert final["counters"]["docs/seen"] == 8 and final["counters"]["docs/weight"] == sum(range(8))
        assert final["stages"][1]["items_out"] == 2 == final["counters"]["zephyr/records_written"]
        assert read_run_record(str(tmp_path / "out")) == final
    finally:
        gates.open(*range(8))
        driver.join(timeout=120)
        dashboard.stop()


def test_shards_waiting_for_a_cpu_are_not_counted_as_running(ray_shared, tmp_path, gates, wait_until):
    """Regression (issue 38): the status said "in flight 18" on 2 cores, counting the tasks Ray
    held in its queue for a CPU with those running. With 6 tasks in flight on the shared Ray's
    2 CPUs (1 CPU each), 2 run and 4 wait, and the 2 not yet submitted are queued."""
    ds = Dataset.from_list(gates.items(8)).map(gates.fn).write_jsonl(str(tmp_path / "out" / "part-{shard}.jsonl"))
    backend = create_backend("ray", max_parallelism=6, progress=False)
    execution = backend.execute(ds)
    driver = threading.Thread(target=lambda: list(execution), daemon=True)
    driver.start()
    try:
        def settled():
            s = execution.status.snapshot()
            sh = s["stages"][0]["shards"]
            return s if (sh["running"], sh["waiting"], sh["queued"]) == (2, 4, 2) else None

        s = wait_until(settled, "2 shards running, 4 waiting for a CPU, 2 queued")
        stragglers = s["stages"][0]["stragglers"]
        assert sorted(g["waiting"] for g in stragglers) == [False, False, True, True, True, True]
        text = format_snapshot(s)
        assert "running 2, waiting for a CPU 4, queued 2" in text and text.count("(waiting for a CPU)") == 4
        gates.open(*range(8))
        driver.join(timeout=120)
        assert not driver.is_alive()
        final = execution.status.snapshot()["stages"][0]["shards"]
        assert (final["done"], final["running"], final["waiting"], final["queued"]) == (8, 0, 0, 0)
    finally:
        gates.open(*range(8))
        driver.join(timeout=120)
        backend.close()
