"""Transient storage errors are lost attempts (retried with backoff, the user's budget untouched);
permanent ones (403, 404) and a user function's own network errors fail as before.

Inputs are read over HTTP (fsspec's HTTP filesystem, which does not retry by itself) from a
real local server that fails requests on purpose, so every failure reaches Zephyr. The same
behaviour through gcsfs and the GCS emulator is in tests/test_resilience_storage.py.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fsspec
import pytest

from zephyr import Dataset, QuarantinedShardsError, QuarantineLimitError, ShardError, create_backend
from zephyr.errors import is_transient_storage_error

ROWS = 30


class FlakyFiles:
    """Serves `/part-N.jsonl` (ROWS records each). `fail(name, times, status)`: the next `times`
    requests for `name` get `status`, or with `status=None` a dropped connection."""

    def __init__(self):
        self.faults: dict[str, list] = {}
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        files = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                status = files._fault(name)
                if status == "drop":
                    self.close_connection = True
                    return
                body = b"".join(b'{"file": "%s", "i": %d}\n' % (name.encode(), i) for i in range(ROWS))
                if status is None and not name.startswith("part-"):
                    status = 404
                self.send_response(status or 200)
                self.send_header("Content-Length", str(0 if status else len(body)))
                self.end_headers()
                if not status and self.command == "GET":
                    self.wfile.write(body)

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(self, name: str, times: int, status: int | None = 503) -> None:
        self.faults[name] = [times, "drop" if status is None else status]

    def _fault(self, name: str):
        with self._lock:
            self.requests[name] = self.requests.get(name, 0) + 1
            fault = self.faults.get(name)
            if fault and fault[0] > 0:
                fault[0] -= 1
                return fault[1]
            return None


@pytest.fixture
def files():
    served = FlakyFiles()
    yield served
    served.server.shutdown()
    served.server.server_close()


def read_all(files: FlakyFiles, names: list[str]) -> Dataset:
    return Dataset.from_list([f"{files.url}/{name}" for name in names]).load_jsonl().map(lambda r: (r["file"], r["i"]))


def expected(names: list[str]) -> list:
    return [(name, i) for name in names for i in range(ROWS)]


@pytest.fixture(params=["sync", "threadpool", pytest.param("ray", marks=pytest.mark.ray)])
def patient_backend(request):
    """A backend of each kind with a short backoff, so retries are quick in tests."""
    if request.param == "ray":
        request.getfixturevalue("ray_shared")
    backend = create_backend(request.param, max_parallelism=4, progress=False, retry_backoff=0.05)
    yield backend
    backend.close()


@pytest.mark.parametrize("status", [503, 500, 429, None], ids=["503", "500", "429", "dropped-connection"])
def test_transient_errors_are_retried_without_charging_the_user_budget(files, patient_backend, status):
    names = ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    # at least two failed attempts (an open makes 2 requests, aiohttp retries a dropped
    # connection once more), more than any user budget (0 locally, 1 on Ray) allows
    files.fail("part-1.jsonl", times=6 if status else 12, status=status)
    execution = patient_backend.execute(read_all(files, names))
    assert list(execution) == expected(names)
    stats = execution.stats[0]
    assert stats.retries_user == 0  # the user's budget is untouched
    assert stats.retries_lost >= 2 and execution.counters["zephyr/storage_retries"] == stats.retries_lost
    assert files.faults["part-1.jsonl"][0] == 0  # every injected failure was served
    shards = execution.status.snapshot()["stages"][0]["shards"]  # the status page counts them as the runner does
    assert (shards["retried_lost"], shards["retried_user"], shards["user_errors"]) == (stats.retries_lost, 0, 0)


def test_a_storage_outage_longer_than_the_loss_budget_fails_naming_the_path_and_shard(files):
    files.fail("part-1.jsonl", times=100)
    backend = create_backend("threadpool", progress=False, retry_backoff=0.01, max_infra_retries=2)
    execution = backend.execute(read_all(files, ["part-0.jsonl", "part-1.jsonl"]))
    with pytest.raises(ShardError, match="a transient storage error") as failed:
        list(execution)
    assert failed.value.shard == 1 and failed.value.transient
    assert f"{files.url}/part-1.jsonl" in str(failed.value)
    assert execution.stats[0].retries_lost == 3  # the first attempt and two retries, all lost
    assert execution.stats[0].retries_user == 0


@pytest.mark.parametrize("status", [403, 404])
def test_permanent_errors_fail_fast_naming_the_path_and_shard(files, patient_backend, status):
    files.fail("part-1.jsonl", times=100, status=status)
    execution = patient_backend.execute(read_all(files, ["part-0.jsonl", "part-1.jsonl"]))
    with pytest.raises(ShardError) as failed:
        list(execution)
    assert failed.value.shard == 1 and not failed.value.transient
    assert f"{files.url}/part-1.jsonl" in str(failed.value)
    attempts = 1 + patient_backend.max_user_retries  # the user budget only: no backoff, no loss
    assert execution.stats[0].retries_lost == 0
    assert execution.stats[0].retries_user == attempts - 1


def test_a_user_functions_own_network_error_is_a_user_error(local_backend, free_port):
    closed = free_port()  # a port nothing listens on

    def fetch(i):
        return urllib.request.urlopen(f"http://127.0.0.1:{closed}/{i}", timeout=5).read()

    execution = local_backend.execute(Dataset.from_list([1]).map(fetch))
    with pytest.raises(ShardError) as failed:
        list(execution)
    assert not failed.value.transient and execution.stats[0].retries_lost == 0


def test_classification_of_real_errors(files):
    def raised(fn):
        try:
            fn()
        except Exception as e:
            return e
        raise AssertionError("nothing raised")

    fs = fsspec.filesystem("http")
    files.fail("part-0.jsonl", times=1, status=503)
    assert is_transient_storage_error(raised(lambda: fs.cat_file(f"{files.url}/part-0.jsonl")))
    files.fail("part-0.jsonl", times=2, status=None)  # aiohttp itself retries a dropped connection once
    assert is_transient_storage_error(raised(lambda: fs.cat_file(f"{files.url}/part-0.jsonl")))
    files.fail("part-0.jsonl", times=1, status=403)
    assert not is_transient_storage_error(raised(lambda: fs.cat_file(f"{files.url}/part-0.jsonl")))
    assert not is_transient_storage_error(raised(lambda: fs.cat_file(f"{files.url}/missing.jsonl")))
    # the same kind of error, raised by a user's own call rather than by a filesystem
    assert not is_transient_storage_error(raised(lambda: urllib.request.urlopen(f"{files.url}/missing.jsonl")))
    assert not is_transient_storage_error(raised(lambda: socket.create_connection(("127.0.0.1", 1), timeout=5)))


def test_a_storage_outage_past_the_loss_budget_is_quarantined_when_the_run_quarantines(files):
    """Regression: with on_shard_failure="quarantine", a shard whose file the store kept failing
    to serve ended the whole run (its ShardError raised, later shards never run), where a shard
    whose worker kept dying is set aside; now it is set aside too and the rest finishes."""
    names = ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    files.fail("part-1.jsonl", times=10_000)
    backend = create_backend("sync", progress=False, retry_backoff=0.0, max_infra_retries=2, on_shard_failure="quarantine")
    execution = backend.execute(read_all(files, names))
    with pytest.raises(QuarantinedShardsError) as caught:
        list(execution)
    (entry,) = caught.value.shards
    assert entry["shard"] == 1 and entry["attempts"] == 3 and f"{files.url}/part-1.jsonl" in entry["message"]
    assert caught.value.results == expected(["part-0.jsonl", "part-2.jsonl"])


def test_a_lost_shard_past_max_quarantined_is_the_fatal_failure_in_the_status(files):
    """The shard lost to storage errors past `max_quarantined` is the run's fatal failure in the
    status, not "abandoned" (as if the run had ended for another reason), although the error
    the run raised is a QuarantineLimitError caused by it."""
    names = ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    files.fail("part-1.jsonl", times=10_000)
    files.fail("part-2.jsonl", times=10_000)
    backend = create_backend("sync", progress=False, retry_backoff=0.0, max_infra_retries=1, on_shard_failure="quarantine")
    execution = backend.execute(read_all(files, names))
    with pytest.raises(QuarantineLimitError):
        list(execution)
    by_attempt = {(f["shard"], f["attempt"]): f for f in execution.status.snapshot()["failures"]}
    assert {key: f["outcome"] for key, f in by_attempt.items()} == {
        (1, 1): "retried", (1, 2): "quarantined", (2, 1): "retried", (2, 2): "fatal"}
    assert by_attempt[2, 2]["kind"] == "lost"


def test_cost_retries_count_the_attempts_run_again_not_the_one_given_up(files):
    """Regression: the stage's `cost.retries["storage"]` counted the last failed attempt as a
    retry too (3 for a shard tried 3 times), while the status said 2 retried: the summary's and
    the status page's cost line disagreed with their own shard counts."""
    files.fail("part-1.jsonl", times=10_000)
    attempts = 3
    backend = create_backend("sync", progress=False, retry_backoff=0.0, max_infra_retries=attempts - 1)
    execution = backend.execute(read_all(files, ["part-0.jsonl", "part-1.jsonl"]))
    with pytest.raises(ShardError):
        list(execution)
    shards = execution.status.snapshot()["stages"][0]["shards"]
    assert (shards["lost"], shards["retried_lost"]) == (attempts, attempts - 1)
    assert execution.stats[0].cost.retries == {"user": 0, "lost": 0, "storage": attempts - 1, "memory": 0}
