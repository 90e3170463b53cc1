"""The status page, served by the driver on aiohttp in a background thread.

    GET /                    the page (HTML; it polls the two routes below)
    GET /api/runs            {"runs": [summary, ...], "latest": run_id}
    GET /api/snapshot[?run=ID]   the snapshot of run ID (default: the latest)

It binds to 127.0.0.1 unless told otherwise. Bound to any other address it requires a token,
generated at start, that it accepts as `Authorization: Bearer TOKEN` or `?token=TOKEN`, and
it answers 401 to anything else. The token appears only in `Dashboard.url`, which the caller
prints once; the access log is off, so request URLs (and the token in them) are never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
import socket
import threading
from html import escape
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from zephyr.status import registry
from zephyr.status.terminal import format_snapshot

__all__ = ["Dashboard", "FileSource", "LiveSource", "page_html", "start_dashboard"]

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (no token needed there)."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def page_html(snapshot: dict | None = None, first_paint: dict | None = None) -> str:
    """The page; with `snapshot`, a self-contained copy that shows it without a server. With
    `first_paint`, the page as served already shows that snapshot as text (title, state, the
    `zephyr status` block) before, or without, its script running; the script then redraws it."""
    html = resources.files("zephyr.status").joinpath("page.html").read_text(encoding="utf-8")
    if first_paint is not None and first_paint.get("run_id"):
        s = first_paint
        title = f"Zephyr run {s['run_id']}" + (f" — {s['label']}" if s.get("label") else "")
        state = str(s.get("state", ""))
        html = html.replace('<h1 id="title">Zephyr run</h1>', f'<h1 id="title">{escape(title)}</h1>')
        html = html.replace('<span id="state" class="badge">loading</span>',
                            f'<span id="state" class="badge {escape(state)}">{escape(state)}</span>')
        html = html.replace('<div id="chain" class="chain"></div>',
                            f'<div id="chain" class="chain"><pre id="first-paint">{escape(format_snapshot(s))}</pre></div>')
    if snapshot is not None:
        embedded = orjson.dumps(snapshot).decode().replace("</", "<\\/")  # cannot close the <script>
        html = html.replace('<script id="zephyr-snapshot" type="application/json"></script>',
                            f'<script id="zephyr-snapshot" type="application/json">{embedded}</script>')
    return html


class LiveSource:
    """The runs of this process (`zephyr.status.registry`)."""

    def runs(self) -> dict[str, Any]:
        latest = registry.latest()
        return {"runs": [r.summary() for r in registry.runs()], "latest": latest.run_id if latest else None}

    def snapshot(self, run_id: str | None) -> dict | None:
        run = registry.find(run_id) if run_id else registry.latest()
        return run.snapshot() if run is not None else None


class FileSource:
    """One finished run, from its record (`zephyr dashboard .zephyr-run.json`)."""

    def __init__(self, snapshot: dict):
        self._snapshot = snapshot

    def runs(self) -> dict[str, Any]:
        s = self._snapshot
        summary = {"run_id": s.get("run_id"), "label": s.get("label"), "state": s.get("state"), "started_at": s.get("started_at"),
                   "stages": len(s.get("stages", [])), "title": (s.get("stages") or [{}])[-1].get("description", "")}
        return {"runs": [summary], "latest": s.get("run_id")}

    def snapshot(self, run_id: str | None) -> dict | None:
        return self._snapshot if run_id in (None, self._snapshot.get("run_id")) else None


class Dashboard:
    """A status page server. `start()` it (or use `start_dashboard`), print `url`, `stop()` it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, source: LiveSource | FileSource | None = None):
        self.host = host
        self.port = port
        self.source = source or LiveSource()
        self._token = None if is_loopback(host) else secrets.token_hex(24)  # hex: never starts with "-", so `--token T` always parses
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"Dashboard(host={self.host!r}, port={self.port}, token={'required' if self._token else 'none'})"

    @property
    def requires_token(self) -> bool:
        return self._token is not None

    @property
    def url(self) -> str:
        """Where to point a browser (with the token, when one is required: print it once)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/" + (f"?token={self._token}" if self._token else "")

    def start(self, timeout: float = 30.0) -> Dashboard:
        started = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, args=(started, failure), name="zephyr-dashboard", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"the dashboard did not start on {self.host}:{self.port} within {timeout}s")
        if failure:
            raise OSError(f"cannot serve the dashboard on {self.host}:{self.port}: {failure[0]}") from failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Dashboard:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the server thread -------------------------------------------------------------------

    def _serve(self, started: threading.Event, failure: list) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        runner = web.AppRunner(self._app(), access_log=None)  # request URLs may carry the token
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]
        except BaseException as e:  # noqa: BLE001 - reported to start()
            failure.append(e)
            started.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._check_token])
        app.router.add_get("/", self._page)
        app.router.add_get("/api/runs", self._runs)
        app.router.add_get("/api/snapshot", self._snapshot)
        return app

    @web.middleware
    async def _check_token(self, request: web.Request, handler):
        if self._token is not None:
            given = request.query.get("token", "")
            auth = request.headers.get("Authorization", "")
            if auth.startswith("Bearer "):
                given = auth[len("Bearer "):]
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                return web.Response(status=401, text="401: this status page needs the token printed when it started "
                                    "(open the printed URL, or send 'Authorization: Bearer TOKEN')\n",
                                    headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def _page(self, request: web.Request) -> web.Response:
        first = self.source.snapshot(request.query.get("run") or None)  # painted by the server: no "loading"
        return web.Response(text=page_html(first_paint=first), content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _runs(self, request: web.Request) -> web.Response:
        return _json(self.source.runs())

    async def _snapshot(self, request: web.Request) -> web.Response:
        run_id = request.query.get("run") or None
        snapshot = self.source.snapshot(run_id)
        if snapshot is None:
            if run_id:
                return _json({"error": f"no run {run_id!r} in this process"}, status=404)
            return _json({"schema": "zephyr-run/1", "run_id": None, "state": "waiting", "stages": [], "counters": {},
                          "failures": [], "failures_total": 0})
        return _json(snapshot)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def start_dashboard(host: str = "127.0.0.1", port: int = 0, source: LiveSource | FileSource | None = None) -> Dashboard:
    """Serve the status page of this process's runs (or of `source`) in a background thread.

    `port=0` picks a free port. Returns the running `Dashboard`; print its `url` (which holds
    the token when `host` is not a loopback address) and `stop()` it when done.
    Raises OSError when the address cannot be bound (e.g. the port is taken).
    """
    return Dashboard(host, port, source).start()
