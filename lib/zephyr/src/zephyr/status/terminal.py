"""`zephyr status` in a terminal: fetch a snapshot (from a status page or a run record) and print it."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request

import orjson

from zephyr.dedup.report import format_dedups
from zephyr.status.costs import cost_line
from zephyr.status.crashes import describe_crash
from zephyr.resources import format_bytes as _bytes
from zephyr.status.record import read_run_record

__all__ = ["fetch_snapshot", "format_snapshot"]


def fetch_snapshot(location: str, token: str | None = None, run: str | None = None, timeout: float = 30.0) -> dict:
    """The snapshot at `location`: a status page URL (http/https), or a run record (file, directory, URL).

    The token is taken from `token`, else from the URL's `?token=`. Raises PermissionError on
    401, ConnectionError when the page cannot be reached, FileNotFoundError for a missing record.
    """
    parts = urllib.parse.urlsplit(location)
    if parts.scheme not in ("http", "https"):
        return read_run_record(location)
    query = dict(urllib.parse.parse_qsl(parts.query))
    token = token or query.get("token")
    api = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/api/snapshot",
                                   urllib.parse.urlencode({"run": run} if run else {}), ""))
    request = urllib.request.Request(api, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as e:
        where = f"{parts.scheme}://{parts.netloc}{parts.path}"  # never echo the token
        if e.code == 401:
            raise PermissionError(f"{where} refused the request (401): pass the URL it printed (with ?token=) or --token") from None
        raise ConnectionError(f"{where} answered HTTP {e.code}: {e.read()[:200].decode(errors='replace')}") from None
    except urllib.error.URLError as e:
        raise ConnectionError(f"cannot reach {parts.scheme}://{parts.netloc}: {e.reason}") from None
    except (http.client.HTTPException, OSError) as e:  # the server closed mid-answer (its driver exiting)
        raise ConnectionError(f"lost {parts.scheme}://{parts.netloc} mid-answer: {type(e).__name__}: {e}") from None


def format_snapshot(s: dict, width: int = 100) -> str:
    """The snapshot as a block of text: the run, each stage, stragglers, failures, counters."""
    if not s.get("run_id"):
        return "zephyr: no pipeline has started yet in this process"
    lines = [f"zephyr run {s['run_id']}: {s['state']} after {_secs(s.get('elapsed_s'))} on {s.get('backend', '?')}"
             f" ({s.get('host', '?')} pid {s.get('pid', '?')})" + (f", for {s['label']}" if s.get("label") else "")]
    if s.get("error"):
        lines.append(f"  error: {s['error']['type']}: {(s['error']['message'].splitlines() or [''])[0][:width]}")
    for item in s.get("not_resumable") or ():
        lines.append(f"  not resumable: stage {item['stage']}: {item['reason'][:width]}")
    for st in s["stages"]:
        lines.extend(_stage_lines(st, width))
    lines.extend(format_dedups(s.get("dedups") or []))
    stragglers = sorted(((st["name"], g) for st in s["stages"] for g in st["stragglers"]), key=lambda x: -x[1]["elapsed_s"])
    if stragglers:
        lines.append("stragglers (slowest in flight):")
        for name, g in stragglers[:10]:
            waiting = " (waiting for a CPU)" if g.get("waiting") else ""
            copied = " (a second attempt runs)" if g.get("second_attempt") else ""
            lines.append(f"  {name} shard {g['shard']} attempt {g['attempt']}: {_secs(g['elapsed_s'])}{waiting}{copied}  {g['source']}")
    copies = [(st["name"], c) for st in s["stages"] for c in st.get("second_attempts") or ()]
    if copies:
        lines.append(f"second attempts of stragglers ({len(copies)}; {s.get('speculation') or ''}):")
        for name, c in copies[:10]:
            outcome = f"attempt {c['winner']} (the {c['won_by']}) won" if c.get("winner") is not None else "running"
            lines.append(f"  {name} shard {c['shard']}: copied after {_secs(c['ran_s'])} (threshold {_secs(c['threshold_s'])}), "
                         f"{outcome}  {c['source']}")
    if s.get("failures_total"):
        lines.append(f"failed attempts ({s['failures_total']}):")
        for f in s["failures"][-10:]:
            kind = "lost" if f["kind"] == "lost" else "out of memory" if f.get("cause") == "memory" else "user error"
            lines.append(f"  stage {f['stage']} shard {f['shard']} attempt {f['attempt']} ({kind}, {f['outcome'] or 'retrying'}) "
                         f"source {f['source']}")
            lines.append(f"    {f['error_type']}: {f['message'].splitlines()[0][:width] if f['message'] else ''}")
    if s.get("quarantined"):
        lines.append(f"quarantined shards ({len(s['quarantined'])}; failed on every attempt, set aside; a rerun retries them):")
        for q in s["quarantined"]:
            lines.append(f"  stage {q['stage']} shard {q['shard']} source {q['source']}: {q['error_type']}: "
                         f"{(q['message'].splitlines() or [''])[0][:width]}")
    for crash in s.get("crashes") or ():
        lines.append(f"CRASHED during the run: {describe_crash(crash)}"[: width * 3])
    total = s.get("cost") or {}
    if total.get("cpu_s"):
        price = f", cost {total['cost']:,.4f} at {s['price_per_core_hour']} per core-hour" if total.get("cost") is not None else ""
        lines.append(f"cost: cpu {total['cpu_s']:,.1f}s, peak rss {_bytes(total['peak_rss'])}{price}")
    if s.get("counters"):
        lines.append("counters:")
        name_width = max(len(k) for k in s["counters"])
        lines.extend(f"  {k:<{name_width}}  {v:,}" for k, v in s["counters"].items())
    if s.get("record_path") and s.get("state") != "running":
        lines.append(f"run record: {s['record_path']}")
    return "\n".join(lines)


def _stage_lines(st: dict, width: int) -> list[str]:
    sh = st["shards"]
    total = max(st["num_shards"], 1)
    filled = round(20 * sh["done"] / total)
    bar = "#" * filled + "-" * (20 - filled)
    ops = " -> ".join(st["ops"])
    head = f"  {st['name']} [{bar}] {sh['done']:,}/{st['num_shards']:,} shards, {st['state']}"
    cancelled = f", cancelled {sh['cancelled']:,}" if sh.get("cancelled") else ""  # records before it have none
    detail = (f"    {_running(sh)}, queued {sh['queued']:,}{cancelled}, resumed {sh['resumed']:,}, failed {sh['failed']:,}; "
              f"retried {sh['retried_lost']:,} lost / {sh['retried_user']:,} user error"
              + (f" / {memory:,} out of memory" if (memory := ((st.get("cost") or {}).get("retries") or {}).get("memory")) else ""))
    elapsed = st.get("elapsed_s") or 0
    flow = (f"    items {st['items_in']:,} in / {st['items_out']:,} out, {_bytes(st['bytes_in'])} in / {_bytes(st['bytes_out'])} out"
            + (f", {st['items_in'] / elapsed:,.0f} items/s in" if elapsed > 0 and st["items_in"] else "")
            + f", {_secs(st.get('elapsed_s'))}")
    cost = cost_line(st.get("cost"))
    return [head, f"    {ops[: width - 4]}", detail, flow] + ([f"    {cost}"] if cost else [])


def _running(sh: dict) -> str:
    """Shards running, and those handed to the backend that wait there for a CPU."""
    if "waiting" not in sh:  # a record written before running and waiting were told apart
        return f"in flight {sh['running']:,}"
    if sh["waiting"] is None:
        return f"in flight {sh['running']:,} (the backend does not say how many run)"
    return f"running {sh['running']:,}, waiting for a CPU {sh['waiting']:,}"


def _secs(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
