"""`zephyr status` and `zephyr dashboard`: look at a run from outside its driver.

    zephyr status http://127.0.0.1:8270/            the live run, as text (--json: the snapshot)
    zephyr status gs://bucket/clean/                a finished run, from its .zephyr-run.json
    zephyr dashboard gs://bucket/clean/ --port 8270  serve that record's page again
    zephyr dashboard out/.zephyr-run.json --html run.html   a self-contained page, no server
    zephyr verify gs://bucket/clean/                every recorded output there with its size, nothing else
    zephyr status --compare gs://b/run1/ gs://b/run2/   two finished runs' stages side by side
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import orjson

from zephyr.status import port_number
from zephyr.status.outputs import verify_directory
from zephyr.status.costs import compare_runs, format_comparison
from zephyr.status.record import read_run_record
from zephyr.status.server import FileSource, page_html, start_dashboard
from zephyr.status.terminal import fetch_snapshot, format_snapshot

__all__ = ["dashboard_main", "status_main", "verify_main"]


def _port(text: str) -> int:
    try:
        return port_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def status_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="zephyr status",
        description="Print a run's state: from a live status page (the URL `zephyr --dashboard` printed) "
        "or from a finished run's record (.zephyr-run.json, or the output directory holding it).",
        epilog="examples:\n  zephyr status http://127.0.0.1:8270/\n  zephyr status --json 'http://head:8270/?token=...'\n"
        "  zephyr status gs://bucket/clean/\n  zephyr status --watch 5 http://127.0.0.1:8270/\n"
        "  zephyr status --compare gs://bucket/clean-v1/ gs://bucket/clean-v2/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("location", nargs="?", help="status page URL, or a run record file or the directory holding one (local or gs://...)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                        help="compare two runs from their records (record files or output directories): each stage's "
                        "time, CPU, peak RSS, bytes, retries and cost side by side, with the ratio B/A")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON (for scripts)")
    parser.add_argument("--token", default=None, help="the page's token, if it is not in the URL")
    parser.add_argument("--run", default=None, help="which run of the driver process (default: the latest)")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS", help="print again every SECONDS until the run ends")
    args = parser.parse_args(list(argv))
    if args.compare is not None:
        if args.location is not None or args.watch is not None:
            parser.error("--compare A B takes no other location and no --watch; e.g. zephyr status --compare out-v1/ out-v2/")
        return _compare(*args.compare, as_json=args.json)
    if args.location is None:
        parser.error("give a location (a status page URL, a run record or its directory), or --compare A B")
    redraw = args.watch is not None and not args.json and sys.stdout.isatty()
    last: dict | None = None
    while True:
        try:
            snapshot = fetch_snapshot(args.location, token=args.token, run=args.run)
        except ConnectionError as e:
            snapshot = _final_state(last) if last is not None else None
            if snapshot is None:
                print(f"zephyr status: error: {e}", file=sys.stderr)
                return 1
        except (PermissionError, FileNotFoundError, ValueError) as e:
            print(f"zephyr status: error: {e}", file=sys.stderr)
            return 1
        if args.json:
            sys.stdout.write(orjson.dumps(snapshot, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            print((CLEAR_SCREEN if redraw else "") + format_snapshot(snapshot), flush=True)
        if args.watch is None or snapshot.get("state") not in LIVE_STATES:
            return 0
        last = snapshot
        time.sleep(args.watch)
        if not redraw:
            print()


def _compare(a: str, b: str, as_json: bool) -> int:
    try:
        first, second = read_run_record(a), read_run_record(b)
    except (FileNotFoundError, ValueError) as e:
        print(f"zephyr status: error: {e}", file=sys.stderr)
        return 1
    if as_json:
        sys.stdout.write(orjson.dumps({"a": a, "b": b, "stages": compare_runs(first, second)}, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_comparison(first, second, a, b))
    return 0


CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, clear: each --watch interval redraws in place on a terminal
LIVE_STATES = ("pending", "running", "waiting")


RECORD_WAIT = 30.0  # seconds to wait for the record once the server is gone (its driver writes it as it exits)
# what tells the watched run's record from an earlier run's at the same path: run ids count per process, so
# every `zephyr script.py` run's first pipeline is run "1"
SAME_RUN = ("run_id", "host", "pid", "started_at")


def _final_state(last: dict, wait: float = RECORD_WAIT) -> dict | None:
    """The watched run's server went away (its driver is exiting): the run's final state from
    the record it writes beside its outputs, or None when none appears within `wait` seconds."""
    path = last.get("record_path")
    if not path:
        return None
    print(f"zephyr status: the status page went away; reading the run's final state from {path}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait
    while True:
        try:
            record = read_run_record(path)
            if all(record.get(key) == last.get(key) for key in SAME_RUN):
                return record
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def dashboard_main(argv: Sequence[str]) -> int:
    parser = _parser(
        "zephyr dashboard",
        "Serve the status page of a finished run from its record (.zephyr-run.json), or write it as one HTML file.",
        ["zephyr dashboard gs://bucket/clean/", "zephyr dashboard out/.zephyr-run.json --port 8270",
         "zephyr dashboard out/ --html run.html"],
    )
    parser.add_argument("record", help="a run record, or the output directory holding .zephyr-run.json (local or gs://...)")
    parser.add_argument("--port", type=_port, default=0, help="port to serve on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other address requires a printed token)")
    parser.add_argument("--html", default=None, metavar="FILE", help="write a self-contained page to FILE instead of serving")
    args = parser.parse_args(list(argv))
    snapshot = _loaded("zephyr dashboard", read_run_record, args.record)
    if snapshot is None:
        return 1
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(page_html(snapshot))
        print(f"zephyr: wrote {args.html}", file=sys.stderr)
        return 0
    try:
        dashboard = start_dashboard(args.host, args.port, FileSource(snapshot))
    except OSError as e:
        print(f"zephyr dashboard: error: {e}", file=sys.stderr)
        return 1
    print(f"zephyr: status page of run {snapshot.get('run_id')} at {dashboard.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        dashboard.stop()


def verify_main(argv: Sequence[str]) -> int:
    parser = _parser(
        "zephyr verify",
        "Check an output directory against its run record (.zephyr-run.json): name every recorded output that is "
        "missing or whose size differs (truncated), and every file the record does not list (extra). Exit 0 when all "
        "match and the recorded run succeeded, 1 otherwise.",
        ["zephyr verify out/", "zephyr verify gs://bucket/clean/", "zephyr verify --json out/"],
    )
    parser.add_argument("directory", help="the output directory holding .zephyr-run.json (local or gs://...), or the record")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON (for scripts)")
    args = parser.parse_args(list(argv))
    found = _loaded("zephyr verify", verify_directory, args.directory)
    if found is None:
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps({**found.__dict__, "ok": found.ok}, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(f"zephyr verify: {found.describe()}", file=sys.stdout if found.ok else sys.stderr)
    return 0 if found.ok else 1


def _parser(prog: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)
    return argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def _loaded(prog: str, load, location: str):
    """`load(location)`, or None once a missing or unreadable record has been reported."""
    try:
        return load(location)
    except (FileNotFoundError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return None
