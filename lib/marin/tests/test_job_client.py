"""The job API client (`marin.cluster.target.connect`): a job server that never answers fails
the request in `JOB_API_TIMEOUT`, naming the server, instead of holding the command forever.

The server is a real HTTP server on localhost that answers Ray's version check and then, for the
endpoints under test, accepts the request and never answers (as a wedged dashboard does).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marin.cluster import target

RAY_VERSION = {"version": "4", "ray_version": "2.60.0", "ray_commit": "test"}


class _Silent(BaseHTTPRequestHandler):
    """Answers GET /api/version (unless the server is fully silent); every other request waits
    until the server is released, then gets no answer."""

    def do_GET(self):
        if self.path == "/api/version" and not self.server.silent_everywhere:
            body = json.dumps(RAY_VERSION).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.server.waiting.append(self.path)
        self.server.released.wait(60)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def silent_server():
    """`silent_server(everywhere)` -> its URL; stopped (its waiting handlers released) after the test."""
    servers = []

    def start(everywhere: bool = False) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Silent)
        server.daemon_threads = True
        server.silent_everywhere, server.waiting, server.released = everywhere, [], threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.released.set()
        server.shutdown()
        server.server_close()


def test_a_request_the_job_server_never_answers_times_out_naming_it(silent_server, monkeypatch):
    monkeypatch.setattr(target, "JOB_API_TIMEOUT", 1.0)
    url = silent_server()
    client = target.connect(url, "a-secret-token")  # the version check is answered
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"the Ray job API at {url} did not answer GET /api/jobs/raysubmit_x within 1s") as e:
        client.get_job_status("raysubmit_x")
    assert time.monotonic() - started < 30
    assert "a-secret-token" not in str(e.value)
    with pytest.raises(TimeoutError, match="did not answer POST /api/jobs/raysubmit_x/stop"):
        client.stop_job("raysubmit_x")


def test_connecting_to_a_job_server_that_never_answers_fails_naming_it(silent_server, monkeypatch):
    monkeypatch.setattr(target, "JOB_API_TIMEOUT", 1.0)
    url = silent_server(everywhere=True)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"Could not connect to the Ray job API at {url}: .*did not answer GET /api/version") as e:
        target.connect(url, "a-secret-token")
    assert time.monotonic() - started < 30
    assert "a-secret-token" not in str(e.value)
