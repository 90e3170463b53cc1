"""A live view of running pipelines: the run-state model, the status page, `zephyr status`.

    from zephyr.status import start_dashboard
    dashboard = start_dashboard()          # 127.0.0.1, a free port
    print(dashboard.url)                   # open it while pipelines run in this process
    ...
    dashboard.stop()

Every `Execution` publishes a `RunStatus` (`execution.status`); `snapshot()` gives its state
as JSON-ready data, the same data the page, `zephyr status` and the run record
(`.zephyr-run.json` beside the outputs) show. The server (aiohttp) is imported only when a
dashboard is started.
"""

from zephyr.status.model import RunStatus
from zephyr.status.record import RECORD_NAME, read_run_record
from zephyr.status.registry import latest, runs
from zephyr.status.terminal import fetch_snapshot, format_snapshot

__all__ = ["RECORD_NAME", "RunStatus", "fetch_snapshot", "format_snapshot", "latest", "port_number", "read_run_record",
           "runs", "start_dashboard"]


def port_number(text: str) -> int:
    """A command-line port (0: any free one); raises ValueError saying what is expected."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a port number 0-65535 (0: a free one), got {text!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"expected a port number 0-65535 (0: a free one), got {value}")
    return value


def start_dashboard(host: str = "127.0.0.1", port: int = 0, source=None):
    """Serve the status page of this process's runs; see `zephyr.status.server.start_dashboard`.
    The server (aiohttp) is imported only here, when a dashboard starts."""
    from zephyr.status.server import start_dashboard as start

    return start(host, port, source)
