"""End-to-end fixtures: a fault-injecting proxy in front of the local GCS emulator."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest


class FaultyGcs:
    """Forwards GCS JSON API requests to the emulator, failing some of them on purpose.

    - every `transient_every`-th request is answered 503 once (a retry of it then goes through);
    - any request whose URL contains one of `forbidden` is answered 403, always.
    """

    def __init__(self, upstream: str, transient_every: int = 0, forbidden: tuple[str, ...] = ()):
        self.upstream = urlsplit(upstream)
        self.transient_every = transient_every
        self.forbidden = forbidden
        self.requests = 0
        self.injected_transient = 0
        self.injected_permanent = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                status = proxy._fault_for(self.path)
                if status:
                    payload = b'{"error": {"code": %d, "message": "injected fault"}}' % status
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _fault_for(self, path: str) -> int:
        with self._lock:
            self.requests += 1
            if any(token in path for token in self.forbidden):
                self.injected_permanent += 1
                return 403
            if self.transient_every and self.requests % self.transient_every == 0:
                self.injected_transient += 1
                return 503
            return 0

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def faulty_gcs(gcs_emulator):
    proxies = []

    def make(**kwargs) -> FaultyGcs:
        proxy = FaultyGcs(gcs_emulator, **kwargs)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
