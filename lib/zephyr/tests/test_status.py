"""The run-state model, the run record, the status page server and `zephyr status` (no Ray).

Pipelines here hold their shards at "gates" (files the test creates) so that a snapshot can be
taken while the run is in a known state; every wait is on a condition with a generous deadline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from zephyr import Dataset, ShardError, counters, create_backend
from zephyr.cli import main as zephyr_main
from zephyr.execution.summary import format_summary
from zephyr.status import RECORD_NAME, read_run_record, start_dashboard
from zephyr.status.model import MAX_FAILURES, MAX_SAMPLES, RunStatus
from zephyr.status.server import FileSource, is_loopback
from zephyr.status.terminal import format_snapshot


def always_fails_at_4(x):
    if x == 4:
        raise ValueError("item 4 is corrupt")
    return {"x": x}


def fails_once_at_2(item):
    gates, x = item
    if x == 2 and not os.path.exists(f"{gates}/failed"):
        open(f"{gates}/failed", "w").close()
        raise ValueError("flaky item 2")
    return {"x": x}


def stable(snapshot: dict) -> dict:
    """A snapshot without what moves with the clock."""
    s = json.loads(json.dumps(snapshot))
    s.pop("elapsed_s", None)
    for st in s["stages"]:
        st.pop("elapsed_s", None)
        st.pop("throughput", None)
        for g in st["stragglers"]:
            g.pop("elapsed_s")
    return s


@pytest.fixture
def dashboard():
    d = start_dashboard()
    yield d
    d.stop()


# ---- the model, at the end of a run ---------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_final_snapshot_is_complete_and_matches_the_runner(tmp_path, backend_name):
    backend = create_backend(backend_name, max_parallelism=3, progress=False)
    words = [f"w{i % 7}" for i in range(40)]
    ds = (Dataset.from_list([words[i::5] for i in range(5)]).flat_map(list).map(lambda w: (counters.increment("words"), w)[1])
          .group_by(lambda w: w, lambda k, items: {"word": k, "n": sum(1 for _ in items)}, num_output_shards=3)
          .write_jsonl(str(tmp_path / "out" / "part-{shard}.jsonl")))
    execution = backend.execute(ds)
    paths = list(execution)
    s = execution.status.snapshot()

    assert s["state"] == "succeeded" and s["error"] is None and s["schema"] == "zephyr-run/1"
    assert s["counters"] == dict(execution.counters)  # what the runner counted
    assert [st["name"] for st in s["stages"]] == ["stage 0", "stage 1"]
    for st, stats in zip(s["stages"], execution.stats):
        assert st["state"] == "done" and st["num_shards"] == stats.num_shards
        assert st["shards"] == {"done": stats.num_shards, "running": 0, "waiting": 0, "queued": 0, "cancelled": 0, "resumed": 0, "failed": 0,
                                "lost": 0, "user_errors": 0, "retried_lost": 0, "retried_user": 0, "quarantined": 0}
        assert st["stragglers"] == []
        assert st["throughput"]["samples"][-1][1] == stats.num_shards  # the last sample: every shard done
    map_stage, reduce_stage = s["stages"]
    assert map_stage["ops"][0] == "from_list(5 items)" and "group_by" in reduce_stage["ops"][0]
    assert map_stage["items_in"] == 5 and map_stage["items_out"] == 40 == s["counters"]["zephyr/shuffle_records"]
    assert reduce_stage["items_in"] == 7 == reduce_stage["items_out"] == s["counters"]["zephyr/records_written"]
    assert map_stage["bytes_out"] + reduce_stage["bytes_out"] == s["counters"]["zephyr/bytes_written"]
    assert reduce_stage["bytes_out"] == sum(os.path.getsize(p) for p in paths)
    assert sum(st["counters"].get("words", 0) for st in s["stages"]) == s["counters"]["words"] == 40
    # the record beside the outputs is this final snapshot
    assert s["record_path"] == str(tmp_path / "out" / RECORD_NAME)
    assert read_run_record(str(tmp_path / "out")) == s
    assert f"run record: {s['record_path']}" in format_summary(execution)


def test_failed_attempts_keep_their_error_and_the_fatal_one_ends_the_run(tmp_path):
    # sync: the order of attempts is fixed (with threads, 2's retry could still be pending when 4 ends the run)
    backend = create_backend("sync", progress=False, max_user_retries=1)
    (tmp_path / "g").mkdir()
    items = [(str(tmp_path / "g"), x) for x in range(6)]
    ds = Dataset.from_list(items).map(fails_once_at_2).map(lambda r: always_fails_at_4(r["x"])).write_jsonl(
        str(tmp_path / "out" / "p-{shard}.jsonl"))
    execution = backend.execute(ds)
    with pytest.raises(ShardError, match="item 4 is corrupt"):
        list(execution)
    s = execution.status.snapshot()

    assert s["state"] == "failed" and s["error"]["type"] == "ShardError" and "item 4 is corrupt" in s["error"]["message"]
    st = s["stages"][0]
    assert st["state"] == "failed"
    assert st["shards"]["failed"] == 1 and st["shards"]["user_errors"] == 3 and st["shards"]["lost"] == 0
    assert st["shards"]["retried_user"] == execution.stats[0].retries_user == 2
    by_attempt = {(f["shard"], f["attempt"]): f for f in s["failures"]}
    assert set(by_attempt) == {(2, 1), (4, 1), (4, 2)} and s["failures_total"] == 3
    assert by_attempt[2, 1]["outcome"] == "retried" and by_attempt[4, 1]["outcome"] == "retried"
    fatal = by_attempt[4, 2]
    assert fatal["outcome"] == "fatal" and fatal["kind"] == "user_error" and fatal["stage"] == 0
    assert fatal["error_type"] == "ValueError" and fatal["message"] == "item 4 is corrupt"
    assert "always_fails_at_4" in fatal["traceback"] and "ValueError: item 4 is corrupt" in fatal["traceback"]
    assert fatal["source"] == execution.plan.stages[0].input[4].label
    assert by_attempt[2, 1]["message"] == "flaky item 2"
    # a failed run leaves its record too
    assert read_run_record(str(tmp_path / "out" / RECORD_NAME))["state"] == "failed"


def test_shards_in_flight_when_the_run_failed_show_as_cancelled_not_queued(tmp_path, wait_until):
    """Regression: a failed run's snapshot counted the shards whose tasks it cancelled as queued."""
    started, stopped = tmp_path / "shard-1-started", []

    def work(x):
        if x == 0:  # fails once shard 1 runs beside it
            wait_until(started.exists, "shard 1 to start")
            raise ValueError("shard 0 is corrupt")
        if x == 1:
            started.touch()
            try:
                while True:  # until the failed run cancels it
                    time.sleep(0.05)
            except BaseException as e:
                stopped.append(f"{type(e).__name__}: {e}")
                raise
        return {"x": x}

    backend = create_backend("threadpool", max_parallelism=2, progress=False, max_user_retries=0)
    execution = backend.execute(Dataset.from_list(list(range(6))).map(work).write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl")))
    with pytest.raises(ShardError, match="shard 0 is corrupt"):
        list(execution)
    shards = execution.status.snapshot()["stages"][0]["shards"]
    assert (shards["failed"], shards["cancelled"], shards["queued"], shards["running"], shards["done"]) == (1, 1, 4, 0, 0)
    assert "queued 4, cancelled 1" in format_snapshot(execution.status.snapshot())
    assert stopped == ["Cancelled: cancelled: the run is stopping"]  # not "interrupted by SIGINT": there was none


def _rerun_after_a_failed_reduce(tmp_path):
    """A group_by whose reduce fails on the first run (its map shards finished), then a rerun:
    the rerun's execution (not yet iterated)."""
    marker = tmp_path / "reduce-may-run"

    def reducer(key, items):
        if not marker.exists():
            raise RuntimeError("reduce not allowed yet")
        return {"k": key, "n": sum(1 for _ in items)}

    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch"))
    ds = Dataset.from_list(list(range(6))).group_by(lambda x: x % 2, reducer).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))
    with pytest.raises(ShardError):
        list(backend.execute(ds))
    marker.touch()
    return backend.execute(ds)


def test_rerun_counts_map_shards_finished_by_the_earlier_run_as_resumed(tmp_path):
    execution = _rerun_after_a_failed_reduce(tmp_path)
    list(execution)
    st = execution.status.snapshot()["stages"][0]
    assert st["shards"]["resumed"] == st["shards"]["done"] == 6 == execution.stats[0].resumed
    assert st["items_in"] == 0  # the work was done by the earlier run; its counters still count
    assert st["counters"]["zephyr/shuffle_records"] == 6


def test_a_stage_every_shard_of_which_resumed_is_done_not_stopped(tmp_path):
    """Regression: a stage whose every map shard an earlier run finished submits no task, so no
    task reported it done; the succeeded run then showed it (status, record, `zephyr status`) as
    `stopped`, as if the caller had stopped iterating. A stage of no shards did the same."""
    list(_rerun_after_a_failed_reduce(tmp_path))
    record = read_run_record(str(tmp_path / "out"))
    assert record["state"] == "succeeded"
    assert [(st["state"], st["shards"]["resumed"], st["shards"]["done"]) for st in record["stages"]] == [("done", 6, 6), ("done", 0, 6)]
    assert record["stages"][0]["elapsed_s"] is not None

    (tmp_path / "empty").mkdir()
    backend = create_backend("sync", progress=False)
    execution = backend.execute(Dataset.from_files(str(tmp_path / "empty" / "*.jsonl"), empty_glob_ok=True).load_jsonl())
    assert list(execution) == []
    s = execution.status.snapshot()
    assert s["state"] == "succeeded" and s["stages"][0]["state"] == "done" and s["stages"][0]["num_shards"] == 0


def test_a_run_is_pending_until_iterated_and_the_page_prefers_running_ones(tmp_path, local_backend):
    from zephyr.status import latest

    started = local_backend.execute(Dataset.from_list([1, 2]).map(lambda x: x))
    next(started)  # running: the second shard is not handed out yet
    never = local_backend.execute(Dataset.from_list([1]).map(lambda x: x))
    assert never.status.snapshot()["state"] == "pending" and started.status.snapshot()["state"] == "running"
    assert latest() is started.status
    assert list(started) == [2] and started.status.snapshot()["state"] == "succeeded"


def test_a_caller_that_stops_early_leaves_the_run_stopped(tmp_path):
    import gc

    execution = create_backend("sync", progress=False).execute(Dataset.from_list(list(range(5))).map(lambda x: x))
    for _ in execution:
        break
    status = execution.status
    del execution
    gc.collect()  # the abandoned run's generator is closed
    s = status.snapshot()
    assert s["state"] == "stopped" and s["stages"][0]["state"] == "stopped"
    assert s["record_path"] is None  # results went to the driver: no output directory, no record


def test_samples_and_failures_stay_bounded_on_long_runs():
    plan = Dataset.from_list(list(range(1000))).map(lambda x: x).plan()
    status = RunStatus(plan, "test", counters=__import__("collections").Counter())
    stage = status._stages[0]
    for t in range(5000):
        status._sample(stage, float(t), force=True)
    assert len(stage.samples) <= MAX_SAMPLES and stage.sample_every > 1.0
    from zephyr.tasks import ShardTask

    for shard in range(500):
        status.shard_failed(0, ShardTask(0, shard, 1000, f"item {shard}"), ValueError(f"e{shard}"), lost=shard % 2 == 0)
    s = status.snapshot()
    assert len(s["failures"]) == MAX_FAILURES and s["failures_total"] == 500
    assert s["failures"][0]["shard"] == 0 and s["failures"][-1]["shard"] == 499  # the first and the latest
    assert s["stages"][0]["shards"]["lost"] == 250 == s["stages"][0]["shards"]["user_errors"]


def test_wildcards_do_not_take_the_run_record_for_an_input(tmp_path, local_backend):
    list(local_backend.execute(Dataset.from_list([[1, 2], [3]]).flat_map(list).map(lambda x: {"x": x})
                               .write_jsonl(str(tmp_path / "out" / "part-{shard}.jsonl"))))
    assert (tmp_path / "out" / RECORD_NAME).exists()
    assert sorted(r["x"] for r in local_backend.execute(Dataset.from_files(str(tmp_path / "out" / "*")).load_jsonl())) == [1, 2, 3]
    assert Dataset.from_files(str(tmp_path / "out" / ".*")).plan().num_shards == 1  # named explicitly, it matches


# ---- the page server, live ------------------------------------------------------------------------


def test_page_serves_the_live_snapshot_of_a_running_pipeline(tmp_path, gates, dashboard, wait_until, http_json):
    backend = create_backend("threadpool", max_parallelism=3, progress=False, max_user_retries=1)
    items = gates.items(6, {1: "raise"})
    execution = backend.execute(Dataset.from_list(items).map(gates.fn).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl")))
    runner = threading.Thread(target=lambda: list(execution), daemon=True)
    runner.start()
    try:
        gates.open(0, 1)
        api = dashboard.url + "api/snapshot"
        # settled: 2 shards done and counted, and the 3 slots refilled; nothing moves until more gates open
        s = wait_until(lambda: (lambda s: s if s["run_id"] == execution.status.run_id and s["stages"][0]["shards"]["done"] == 2
                              and s["stages"][0]["shards"]["running"] == 3 and s["counters"].get("docs/weight") == 1
                              else None)(http_json(api)), "2 shards done, 3 running")
        st = s["stages"][0]
        # shards 0 and 1 done (1 after a retried failure); 2, 3, 4 held at their gates; 5 waits for a slot
        assert st["state"] == "running" and s["state"] == "running"
        assert st["shards"]["running"] == 3 and st["shards"]["queued"] == 1
        assert sorted(g["shard"] for g in st["stragglers"]) == [2, 3, 4]
        assert st["shards"]["retried_user"] == 1 and s["failures"][0]["message"] == "bad record in item 1: unterminated string"
        # the failed attempt's counts are dropped, as the runner drops them
        assert s["counters"] == dict(execution.counters) == {"docs/seen": 2, "docs/weight": 1, "zephyr/records_written": 2,
                                                             "zephyr/bytes_written": s["counters"]["zephyr/bytes_written"]}
        assert stable(s) == stable(execution.status.snapshot())
        runs = http_json(dashboard.url + "api/runs")
        assert runs["latest"] == execution.status.run_id and execution.status.run_id in [r["run_id"] for r in runs["runs"]]
        with pytest.raises(urllib.error.HTTPError) as missing:
            http_json(dashboard.url + "api/snapshot?run=no-such-run")
        assert missing.value.code == 404
        with urllib.request.urlopen(dashboard.url, timeout=30) as response:
            assert b'id="zephyr-snapshot"' in response.read()
    finally:
        gates.open(*range(6))
        runner.join(timeout=120)
    final = http_json(dashboard.url + f"api/snapshot?run={execution.status.run_id}")
    assert final["state"] == "succeeded" and final == read_run_record(str(tmp_path / "out"))


def test_zephyr_status_prints_the_page_or_the_record(tmp_path, dashboard, capsys):
    ds = Dataset.from_list([0, 1, 2]).map(lambda x: (counters.increment("kept"), {"x": x})[1])
    execution = create_backend("sync", progress=False).execute(ds.write_jsonl(str(tmp_path / "out" / "{shard}.jsonl")))
    list(execution)
    capsys.readouterr()

    assert zephyr_main(["status", dashboard.url, "--run", execution.status.run_id]) == 0
    text = capsys.readouterr().out
    assert f"zephyr run {execution.status.run_id}: succeeded" in text
    assert "stage 0 [####################] 3/3 shards, done" in text and "map(<lambda at test_status.py" in text
    assert "kept" in text and "zephyr/records_written" in text

    assert zephyr_main(["status", "--json", dashboard.url, "--run", execution.status.run_id]) == 0
    assert json.loads(capsys.readouterr().out) == execution.status.snapshot()

    for location in (str(tmp_path / "out"), str(tmp_path / "out" / RECORD_NAME)):
        assert zephyr_main(["status", location]) == 0
        assert "3/3 shards, done" in capsys.readouterr().out
    assert zephyr_main(["status", str(tmp_path / "nowhere")]) == 1
    assert "no run record at" in capsys.readouterr().err


def test_a_record_is_served_again_or_saved_as_one_page(tmp_path, capsys, http_json):
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1, 2]).map(always_fails_at_4).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))))
    record = read_run_record(str(tmp_path / "out"))
    with start_dashboard(source=FileSource(record)) as served:
        assert http_json(served.url + "api/snapshot") == record
        assert http_json(served.url + "api/runs")["latest"] == record["run_id"]
    assert zephyr_main(["dashboard", str(tmp_path / "out"), "--html", str(tmp_path / "run.html")]) == 0
    html = (tmp_path / "run.html").read_text()
    embedded = html.split('<script id="zephyr-snapshot" type="application/json">', 1)[1].split("</script>", 1)[0]
    assert json.loads(embedded) == record


# ---- security -----------------------------------------------------------------------------------------

SERVE_SCRIPT = """
import logging, sys, time
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)   # everything any library logs
logging.getLogger("probe").debug("logging is on")
from zephyr import Dataset, flow_backend
list(flow_backend().execute(Dataset.from_list([1, 2, 3]).map(lambda x: x)))
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_off_loopback_every_request_needs_the_token_and_the_token_is_never_logged(tmp_path, http_json):
    script = tmp_path / "serve.py"
    script.write_text(SERVE_SCRIPT)
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "zephyr", "--backend=sync", "--dashboard", "--dashboard-host", "0.0.0.0",
                                 str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        line = next(ln for ln in stderr_path.read_text().splitlines() if "status page at" in ln)
        url = line.split("status page at ", 1)[1].split()[0]
        token = url.split("?token=", 1)[1]
        # hex, so `zephyr status URL --token T` parses (a urlsafe token starting with "-" did not: a flake)
        assert len(token) >= 24 and re.fullmatch(r"[0-9a-f]+", token)
        port = url.split(":")[2].split("/")[0]
        base = f"http://127.0.0.1:{port}/"
        for path, headers in [("", {}), ("api/snapshot", {}), ("api/runs", {}), ("api/snapshot?token=wrong", {}),
                              ("api/snapshot", {"Authorization": "Bearer wrong"}), ("api/snapshot", {"Authorization": token})]:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=30)
            assert refused.value.code == 401, path
            assert token not in refused.value.read().decode()
        assert http_json(base + "api/snapshot", {"Authorization": f"Bearer {token}"})["state"] == "succeeded"
        assert http_json(base + f"api/snapshot?token={token}")["state"] == "succeeded"
        with urllib.request.urlopen(base + f"?token={token}", timeout=30) as page:
            assert page.status == 200
        assert zephyr_main(["status", "--json", url]) == 0  # the printed URL carries the token
        assert zephyr_main(["status", base, "--token", token]) == 0
        assert zephyr_main(["status", base]) == 1  # without it: refused
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = stderr_path.read_text()
    assert log.count(token) == 1, "the token must be printed once (the URL) and never logged"
    assert "DEBUG:probe:logging is on" in log  # every logger wrote to stderr while the requests came in


def test_loopback_needs_no_token_and_other_addresses_do(http_json):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("head-node")
    with start_dashboard("127.0.0.1") as local:
        assert not local.requires_token and "token" not in local.url
        assert http_json(local.url + "api/runs")["runs"] is not None
    with start_dashboard("0.0.0.0") as open_to_all:
        assert open_to_all.requires_token and "token=" in open_to_all.url
        assert open_to_all.url.split("token=")[1] not in repr(open_to_all)


def test_dashboard_option_errors_are_clear(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    with pytest.raises(SystemExit):
        zephyr_main(["--dashboard=http", str(script)])
    assert "expected a port number" in capsys.readouterr().err
    with start_dashboard() as taken, pytest.raises(SystemExit):
        zephyr_main(["--backend=sync", f"--dashboard={taken.port}", str(script)])
    assert "--dashboard: cannot serve the dashboard on 127.0.0.1" in capsys.readouterr().err


def test_zephyr_status_watch_follows_a_run_until_it_ends(tmp_path, gates, dashboard, wait_until, capsys):
    backend = create_backend("threadpool", max_parallelism=2, progress=False)
    execution = backend.execute(Dataset.from_list(gates.items(3)).map(gates.fn))
    driver = threading.Thread(target=lambda: list(execution), daemon=True)
    driver.start()
    run = execution.status.run_id
    watcher = threading.Thread(target=lambda: zephyr_main(["status", "--watch", "0.05", dashboard.url, "--run", run]), daemon=True)
    printed: list[str] = []
    try:
        watcher.start()
        # held at the gates, the run is printed again and again
        wait_until(lambda: printed.append(capsys.readouterr().out) or "".join(printed).count(f"zephyr run {run}: running") >= 2,
                   "two prints of the running run")
    finally:
        gates.open(0, 1, 2)
        driver.join(timeout=120)
        watcher.join(timeout=120)
    assert not watcher.is_alive()  # it stopped by itself once the run ended
    printed.append(capsys.readouterr().out)
    assert f"zephyr run {run}: succeeded" in "".join(printed).split("\n\n")[-1]


def test_zephyr_dashboard_serves_a_record_until_stopped(tmp_path, http_json):
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1, 2]).map(lambda x: {"x": x}).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))))
    proc = subprocess.Popen([sys.executable, "-m", "zephyr", "dashboard", str(tmp_path / "out")], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "zephyr: status page of run" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        assert http_json(url + "api/snapshot") == read_run_record(str(tmp_path / "out"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_zephyr_status_watch_ends_on_the_record_when_the_server_goes_away(tmp_path, gates, wait_until, capsys):
    """Regression (issue 24): `zephyr status --watch` exited 1 ("Connection refused") when the
    run's driver exited, instead of showing the run's final state."""
    page = start_dashboard()
    backend = create_backend("threadpool", max_parallelism=2, progress=False)
    out = tmp_path / "out"
    execution = backend.execute(Dataset.from_list(gates.items(2)).map(gates.fn).map(lambda x: {"x": x})
                                .write_jsonl(str(out / "{shard}.jsonl")))
    driver = threading.Thread(target=lambda: list(execution), daemon=True)
    driver.start()
    run = execution.status.run_id
    code: list[int] = []
    watcher = threading.Thread(target=lambda: code.append(zephyr_main(["status", "--watch", "0.05", page.url, "--run", run])),
                               daemon=True)
    printed: list[str] = []
    try:
        watcher.start()
        wait_until(lambda: printed.append(capsys.readouterr().out) or f"zephyr run {run}: running" in "".join(printed),
                   "the running run printed")
        page.stop()  # the server goes away first, as when the driver exits
    finally:
        gates.open(0, 1)
        driver.join(timeout=120)
        watcher.join(timeout=120)
    assert not watcher.is_alive() and code == [0]
    printed.append(capsys.readouterr().out)
    assert f"zephyr run {run}: succeeded" in "".join(printed).split("\n\n")[-1]
    assert (out / ".zephyr-run.json").exists()


def test_zephyr_status_watch_redraws_in_place_on_a_terminal(tmp_path, monkeypatch, capsys):
    """Regression (issue 24): --watch reprinted the whole block each interval on a terminal."""
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1]).map(lambda x: {"x": x}).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert zephyr_main(["status", "--watch", "1", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.startswith("\x1b[H\x1b[2J")


def test_the_page_as_served_shows_the_run_without_javascript(tmp_path):
    """Regression (issue 24): without JavaScript (a plain screenshot, a text browser) the page said "loading"."""
    from zephyr.status.server import FileSource

    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1, 2]).map(lambda x: {"x": x}).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))))
    record = read_run_record(str(tmp_path / "out"))
    record["label"] = "executor step <tokenize>"  # escaped in the HTML
    with start_dashboard(source=FileSource(record)) as page:
        html = urllib.request.urlopen(page.url, timeout=30).read().decode()
    assert ">loading<" not in html
    assert f'<h1 id="title">Zephyr run {record["run_id"]} — executor step &lt;tokenize&gt;</h1>' in html
    assert '<span id="state" class="badge succeeded">succeeded</span>' in html
    assert "stage 0" in html.split('<pre id="first-paint">')[1].split("</pre>")[0]


def test_items_out_counts_only_what_this_run_wrote(tmp_path):
    """Regression: a shard whose output skip_existing kept counted its returned path as one item
    out, so a rerun writing 10 records over 4 shards reported 13, and one writing none, 4."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i, n in enumerate([10, 5, 5, 5]):
        (inputs / f"{i}.jsonl").write_text("".join(json.dumps({"i": i, "j": j}) + "\n" for j in range(n)))

    def run():
        ds = Dataset.from_files(str(inputs / "*.jsonl")).load_jsonl().write_jsonl(str(tmp_path / "out" / "part-{shard}.jsonl"), skip_existing=True)
        execution = create_backend("sync", progress=False).execute(ds)
        list(execution)
        return execution.status.snapshot()

    first = run()
    assert first["stages"][0]["items_out"] == 25 == first["counters"]["zephyr/records_written"]
    os.remove(tmp_path / "out" / "part-0.jsonl")  # one output to write again: 10 records
    again = run()
    assert again["stages"][0]["items_out"] == 10 == again["counters"]["zephyr/records_written"]
    assert run()["stages"][0]["items_out"] == 0  # everything kept


def by_k(r):
    return r["k"]


def test_a_stage_cut_into_more_shards_by_skew_shows_the_shards_it_ran(tmp_path, monkeypatch):
    """Regression: a skewed partition cut into key ranges gives the reduce stage more tasks than
    the plan's partitions; the status kept the plan's count, so it showed "8/4 shards", called
    the stage done once 4 had finished while the others still ran, and disagreed with the
    summary and the outputs the record lists."""
    from zephyr.shuffle.keys import key_bytes, partition_of

    monkeypatch.setenv("ZEPHYR_SKEW_MIN_BYTES", "1")
    hot = [k for k in range(3000) if partition_of(key_bytes(k), 4) == 1]  # most records land in partition 1
    records = [{"k": hot[i % len(hot)] if i % 10 else i % 3000, "pad": "p" * 200} for i in range(20_000)]
    ds = (Dataset.from_list([records[i::3] for i in range(3)]).flat_map(list)
          .group_by(by_k, lambda k, items: {"k": k, "n": sum(1 for _ in items)}, num_output_shards=4)
          .write_jsonl(str(tmp_path / "out" / "part-{shard:03d}.jsonl")))
    execution = create_backend("sync", progress=False).execute(ds)
    paths = list(execution)
    assert len(paths) > 4  # the hot partition was cut
    reduce = read_run_record(str(tmp_path / "out"))["stages"][1]
    assert reduce["num_shards"] == len(paths) == execution.stats[1].num_shards
    assert reduce["shards"]["done"] == len(paths) and reduce["state"] == "done"
    assert reduce["throughput"]["samples"][-1][1] == len(paths)  # the stage ended with its last shard
    assert f"{len(paths)}/{len(paths)} shards, done" in format_snapshot(read_run_record(str(tmp_path / "out")))


def max_and_mean(x):
    counters.pipeline.set_aggregation("largest", "max")
    counters.pipeline.update_counter("largest", x)
    counters.pipeline.set_aggregation("mean", "average")
    counters.pipeline.update_counter("mean", x)
    return {"x": x}


def test_the_summary_shows_the_counters_the_status_and_record_show(tmp_path):
    """Regression: the end-of-run summary listed the aggregation companions of max/min/average
    counters (`zephyr/aggregation:max:largest  1`) as counters of their own, which the status,
    the page and the run record leave out."""
    execution = create_backend("sync", progress=False).execute(
        Dataset.from_list([1, 5, 3]).map(max_and_mean).write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl")))
    list(execution)
    record = read_run_record(str(tmp_path / "out"))
    assert record["counters"]["largest"] == 5 and record["counters"]["mean"] == 3.0
    listed = format_summary(execution).split("  counters:\n")[1].split("\n  run record:")[0].splitlines()
    assert {line.split()[0]: line.split()[1] for line in listed} == {k: f"{v:,}" for k, v in record["counters"].items()}


def test_a_run_that_failed_with_an_empty_message_still_shows(tmp_path, capsys):
    """Regression: a run ended by an error whose message is empty (`TimeoutError()`) made
    `zephyr status` (and the page's first paint, and `zephyr dashboard`) fail with an IndexError."""
    status = RunStatus(Dataset.from_list([1]).map(lambda x: x).plan(), "test", counters=__import__("collections").Counter())
    status.ended_early(TimeoutError())
    record = tmp_path / RECORD_NAME
    record.write_text(json.dumps(status.snapshot()))
    assert zephyr_main(["status", str(record)]) == 0
    assert "  error: TimeoutError: \n" in capsys.readouterr().out
    from zephyr.status.server import page_html

    assert "error: TimeoutError" in page_html(first_paint=status.snapshot())


def test_zephyr_status_watch_never_takes_an_earlier_runs_record_for_the_watched_run(tmp_path, capsys):
    """Regression: when the watched page went away, `zephyr status --watch` took the record at
    the run's record path for its final state if its run id matched; run ids count per process
    (each `zephyr script.py` starts at "1"), so a driver that died before writing its record
    was reported with the state of an earlier process's run into the same directory."""
    from zephyr.status.commands import _final_state

    out = tmp_path / "out"
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1]).map(lambda x: {"x": x}).write_jsonl(str(out / "{shard}.jsonl"))))
    earlier = read_run_record(str(out))
    assert _final_state(earlier, wait=0) == earlier  # the run's own record is its final state
    watched = {**earlier, "state": "running", "pid": earlier["pid"] + 1, "started_at": earlier["started_at"] + 60}
    assert _final_state(watched, wait=0) is None  # same run id, another process: not this run's record


def test_items_out_of_a_stage_that_writes_files_then_shuffles_counts_each_record_once(tmp_path):
    """Regression: a stage that writes its records to files, reads them back and shuffles them
    counted each record twice (written, then shuffled) in its items out; and once skip_existing
    kept those files, the shard counted none, though it still shuffled every record."""
    shards = [[{"k": i % 3, "i": i} for i in range(10)], [{"k": 1, "i": 99}]]
    ds = (Dataset.from_list(shards).flat_map(list)
          .write_jsonl(str(tmp_path / "mid" / "m-{shard}.jsonl"), skip_existing=True).load_jsonl()
          .group_by(lambda r: r["k"], lambda k, rs: {"k": k, "n": sum(1 for _ in rs)}, num_output_shards=2)
          .write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl")))
    for _ in range(2):  # the second run keeps the files and shuffles the records again
        execution = create_backend("sync", progress=False).execute(ds)
        list(execution)
        scatter = execution.status.snapshot()["stages"][0]
        assert scatter["items_out"] == 11 == scatter["counters"]["zephyr/shuffle_records"]
    assert scatter["counters"]["zephyr/shards_skipped_existing"] == 2


def test_zephyr_status_names_each_crashed_worker_process(tmp_path):
    """Issue 38: `zephyr status` of a record with crashed workers prints a line for each."""
    list(create_backend("sync", progress=False).execute(Dataset.from_list([{"x": 1}]).write_jsonl(str(tmp_path / "out" / "{shard}.jsonl"))))
    record = read_run_record(str(tmp_path / "out"))
    assert record["crashes"] == []  # sync runs tasks in the driver: a crash there ends the run itself
    record["crashes"] = [{"pid": 7, "host": "h", "task": None, "exit": "SYSTEM_ERROR", "detail": "Worker unexpectedly exits",
                          "log": [], "at": 0.0}]
    assert ("CRASHED during the run: Ray worker pid 7 on h died: SYSTEM_ERROR: Worker unexpectedly exits; "
            "Ray retried any task it was running") in format_snapshot(record)
