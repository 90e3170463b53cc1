"""The status page in a real headless Chromium: what it renders matches the JSON it was served.

Chromium comes from the system (`apt-get install chromium`; `.ci/run` installs it). Without it
the tests skip locally, but fail in CI (the CI environment variable is set), so that a missing
browser is never a silent pass there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

from zephyr import Dataset, create_backend
from zephyr.status import read_run_record, start_dashboard

pytestmark = pytest.mark.slow

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = next((p for p in (os.environ.get("ZEPHYR_CHROMIUM"), *map(shutil.which, BROWSERS)) if p), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs a headless Chromium for the status page tests: .ci/run installs Debian's "
                        "`chromium` (apt-get install -y chromium), or set ZEPHYR_CHROMIUM to a browser binary")
        pytest.skip("no chromium on this machine (apt-get install -y chromium); CI runs this test")
    return path


def browse(chromium: str, url: str, profile: Path, *options: str) -> str:
    """Run headless Chromium on `url`; return its stdout (the DOM, with --dump-dom)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"]
    done = subprocess.run([chromium, *flags, *options, url], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Elements(HTMLParser):
    """Every element of a DOM dump with its attributes and its whole text."""

    VOID = {"br", "img", "input", "meta", "link", "hr", "col", "source"}

    def __init__(self, html: str):
        super().__init__()
        self.all: list[tuple[str, dict, list]] = []
        self._open: list[tuple[str, dict, list]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = (tag, dict(attrs), [])
        self.all.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag):
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, _, text in self._open:
            text.append(data)

    def find(self, **attrs) -> list[str]:
        """Texts of the elements whose attributes include `attrs` (underscores for dashes)."""
        wanted = {k.replace("_", "-"): str(v) for k, v in attrs.items()}
        return ["".join(text).strip() for _, a, text in self.all if all(a.get(k) == v for k, v in wanted.items())]

    def classes(self, name: str) -> list[str]:
        return ["".join(text).strip() for _, a, text in self.all if name in a.get("class", "").split()]


@pytest.fixture
def running_pipeline(tmp_path, gates, wait_until, http_json):
    """A two-stage pipeline held mid-run: 6 of 10 map shards done (one after a failed attempt), 4 in flight."""
    backend = create_backend("threadpool", max_parallelism=4, progress=False, max_user_retries=1)
    ds = (Dataset.from_list(gates.items(10, {3: "raise"})).map(gates.fn)
          .group_by(lambda r: r["i"] % 3, lambda k, rs: {"k": k, "n": sum(1 for _ in rs)})
          .write_jsonl(str(tmp_path / "out" / "part-{shard:02d}.jsonl")))
    dashboard = start_dashboard()
    execution = backend.execute(ds)
    driver = threading.Thread(target=lambda: list(execution), daemon=True)
    driver.start()
    try:
        gates.open(*range(6))

        def settled():
            s = http_json(dashboard.url + "api/snapshot")
            sh = s["stages"][0]["shards"] if s["run_id"] == execution.status.run_id else None
            return s if sh and sh["done"] == 6 and sh["running"] == 4 and s["counters"].get("docs/seen") == 6 else None

        wait_until(settled, "6 shards done, 4 in flight")
        yield dashboard, execution
    finally:
        gates.open(*range(10))
        driver.join(timeout=120)
        dashboard.stop()


def test_the_page_shows_the_running_pipeline_as_the_json_says(chromium, running_pipeline, tmp_path, http_json):
    dashboard, execution = running_pipeline
    dom = Elements(browse(chromium, dashboard.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    s = http_json(dashboard.url + "api/snapshot")  # nothing moves while the gates are closed

    assert s["state"] == "running" and dom.find(id="state") == ["running"]
    assert dom.classes("stage-name") == [st["name"] for st in s["stages"]] == ["stage 0", "stage 1"]
    for st in s["stages"]:
        sh = st["shards"]
        assert dom.find(data_stage=st["index"], data_field="progress") == [f"{sh['done']:,} / {st['num_shards']:,} done"]
        assert dom.find(data_stage=st["index"], data_field="running") == [f"{sh['running']:,}"]
        assert dom.find(data_stage=st["index"], data_field="waiting") == [f"{sh['waiting']:,}"]
        assert dom.find(data_stage=st["index"], data_field="queued") == [f"{sh['queued']:,}"]
        assert dom.find(data_stage=st["index"], data_field="cancelled") == [f"{sh['cancelled']:,}"]
        assert [a["title"] for _, a, _ in dom.all if a.get("class") == "ops"][st["index"]] == " → ".join(st["ops"])
    assert dom.find(data_stage=0, data_field="progress") == ["6 / 10 done"]
    assert dom.find(data_stage=0, data_field="retried") == ["0 lost, 1 user error"]
    assert s["counters"]["docs/weight"] == sum(range(6))
    assert len([a for _, a, _ in dom.all if "data-total" in a]) == len(s["counters"])
    for name, value in s["counters"].items():
        assert dom.find(data_total=name) == [f"{value:,}"], name
        assert dom.find(data_counter=name)[0].startswith(name)
    stragglers = dom.find(data_straggler="0/6") + dom.find(data_straggler="0/9")
    assert len(stragglers) == 2 and {g["shard"] for g in s["stages"][0]["stragglers"]} == {6, 7, 8, 9}
    failure = dom.find(data_stage=0, data_shard=3)
    assert len(failure) == 1 and "ValueError: bad record in item 3: unterminated string" in failure[0]
    assert "user error" in failure[0] and "retried" in failure[0] and "attempt 1" in failure[0]
    assert "in gated" in failure[0]  # its traceback is on the page (folded)


def test_the_page_renders_as_an_image(chromium, running_pipeline, tmp_path):
    dashboard, _ = running_pipeline
    shot = tmp_path / "page.png"
    browse(chromium, dashboard.url, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1400",
           "--virtual-time-budget=5000", "--hide-scrollbars")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real page, not a blank one


def _two_stage_record(tmp_path) -> dict:
    """A finished run's record whose first stage ran 0.1 s at ~60,000 items/s and whose second
    ran 60 s at ~100 items/s (the samples are the model's: t, shards done, items in, out, bytes)."""
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list([1]).map(lambda x: {"x": x}).write_jsonl(str(tmp_path / "rec" / "{shard}.jsonl"))))
    record = read_run_record(str(tmp_path / "rec"))
    first, second = dict(record["stages"][0]), dict(record["stages"][0])
    first.update(index=0, name="stage 0", throughput={"columns": first["throughput"]["columns"], "samples": [
        [0.0, 0, 0, 0, 0, 0], [0.05, 1, 3000, 3000, 0, 0], [0.1, 2, 6000, 6000, 0, 0]]})
    samples = [[0.1 + t, t // 10, 100 * t, 100 * t, 0, 0] for t in range(0, 61)]
    second.update(index=1, name="stage 1", throughput={"columns": first["throughput"]["columns"], "samples": samples})
    record.update(stages=[first, second], elapsed_s=60.1)
    return record


def test_the_chart_gives_each_stage_its_own_scale(chromium, tmp_path):
    """Regression (issue 24): a 0.1 s stage at 66,563 items/s set the chart's scale, so the
    60 s main stage was a flat line at the bottom."""
    from zephyr.status.server import FileSource

    with start_dashboard(source=FileSource(_two_stage_record(tmp_path))) as page:
        html = browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000")
    lines = re.findall(r'<polyline data-stage="(\d+)" points="([^"]+)"', html)
    assert [stage for stage, _ in lines] == ["0", "1"], html[-3000:]
    top, bottom = 10.0, 220 - 24  # the chart's plot area (T and H - B in the page's script)
    for _, points in lines:
        ys = [float(p.split(",")[1]) for p in points.split()]
        assert min(ys) == pytest.approx(top, abs=1)  # each line reaches its own peak at the top
    slow = [float(p.split(",")[1]) for p in lines[1][1].split()]
    assert sorted(slow)[len(slow) // 2] < (top + bottom) / 2  # the main stage's line is not flat at the bottom
    assert "stage 1 (peak 100/s)" in html


def test_the_page_shows_running_and_waiting_apart_and_in_flight_where_it_cannot_tell(chromium, tmp_path):
    """Regression (issues 24 and 38): "running 24", then "in flight 18", on 2 CPUs: shards handed
    to the backend are running or waiting there for a CPU, and the page shows each count. A
    record that cannot tell them apart (written before, or a backend that does not say) shows
    "in flight" and "?" for waiting."""
    from zephyr.status.server import FileSource

    record = _two_stage_record(tmp_path)
    record["state"] = "running"
    for st, (running, waiting) in zip(record["stages"], [(2, 16), (0, 0)]):
        st["shards"] = {**st["shards"], "running": running, "waiting": waiting}
    older = json.loads(json.dumps(record))
    for st in older["stages"]:
        del st["shards"]["waiting"]
    pages = []
    for source in (record, older):
        with start_dashboard(source=FileSource(source)) as page:
            pages.append(Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000")))
    measured, unknown = pages
    assert measured.find(data_stage=0, data_field="running") == ["2"] and measured.find(data_stage=0, data_field="waiting") == ["16"]
    [chain] = measured.find(id="chain")
    assert "running" in chain and "waiting for a CPU" in chain and "in flight" not in chain
    assert unknown.find(data_stage=0, data_field="running") == ["2"] and unknown.find(data_stage=0, data_field="waiting") == ["?"]
    [chain] = unknown.find(id="chain")
    assert "in flight" in chain


def test_the_page_names_what_started_the_run(chromium, tmp_path):
    """Regression (issue 24): the page of a pipeline run by an executor step did not name the step."""
    from zephyr.status.server import FileSource

    record = _two_stage_record(tmp_path)
    record["label"] = "executor step tokenize"
    with start_dashboard(source=FileSource(record)) as page:
        dom = Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    assert dom.find(id="title") == [f"Zephyr run {record['run_id']} — executor step tokenize"]


def test_the_page_shows_each_stages_cost(chromium, tmp_path):
    """Issue 29: the cost table shows each stage's CPU, peak RSS, retries by cause and priced cost."""
    from zephyr.status.server import FileSource

    out = tmp_path / "priced"
    list(create_backend("sync", progress=False, price_per_core_hour=3.6).execute(
        Dataset.from_list([1, 2]).map(lambda x: {"x": x}).write_jsonl(str(out / "{shard}.jsonl"))))
    record = read_run_record(str(out))
    record["stages"][0]["cost"]["retries"] = {"user": 1, "lost": 2, "storage": 3, "memory": 4}
    record["stages"][0]["cost"].update(peak_rss=123_456_789, peak_rss_shared=True)
    with start_dashboard(source=FileSource(record)) as page:
        dom = Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    cost = record["stages"][0]["cost"]
    assert dom.find(data_field="cpu_s") == [f"{cost['cpu_s']:.2f}s"]
    assert dom.find(data_field="cost") == [f"{cost['cost']:.4f}"]
    assert dom.find(data_field="retries") == ["1 user, 2 lost, 3 storage, 4 memory"]
    assert dom.find(data_field="peak_rss") == ["123.5 MB (shared)"]


def test_the_page_shows_crashed_worker_processes(chromium, tmp_path):
    """Issue 38: a Ray worker that crashed during a run is a section of the page (hidden when none)."""
    from zephyr.status.server import FileSource

    record = _two_stage_record(tmp_path)
    record["crashes"] = [{"pid": 4242, "host": "10.0.0.7", "task": "zephyr_shard", "exit": None, "detail": None,
                          "log": ["*** SIGABRT received at time=1 on cpu 0 ***", "Mutex corrupt: both reader and writer lock held"],
                          "at": record["started_at"]}]
    with start_dashboard(source=FileSource(record)) as page:
        dom = Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    [crash] = dom.find(data_crash="10.0.0.7/4242")
    assert "Ray worker pid 4242 on 10.0.0.7" in crash and "Mutex corrupt: both reader and writer lock held" in crash
    assert "crashed, by the crash dump it logged" in crash


def test_the_page_shows_each_dedups_documents_in_out_and_removed(chromium, tmp_path):
    """Issue 38: the page gives each dedup its counts, as the record's `dedups` section says."""
    from zephyr.status.server import FileSource

    recs = [{"t": f"doc {i % 3}"} for i in range(10)]
    out = tmp_path / "out"
    list(create_backend("sync", progress=False).execute(
        Dataset.from_list(recs).deduplicate(lambda r: r["t"]).write_jsonl(str(out / "{shard}.jsonl"))))
    record = read_run_record(str(out))
    assert record["dedups"][0]["documents_in"] == 10 and record["dedups"][0]["documents_out"] == 3
    with start_dashboard(source=FileSource(record)) as page:
        dom = Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    [section] = [a for _, a, _ in dom.all if a.get("id") == "dedup-section"]
    assert "hidden" not in section and dom.find(data_dedup=0)[0].startswith("deduplicate(")
    for field, value in (("documents_in", "10"), ("documents_out", "3"), ("removed", "7")):
        assert dom.find(data_field=field) == [value], field


def test_the_page_shows_which_attempt_of_a_copied_straggler_won(chromium, tmp_path):
    """Issue 41: a straggler's second attempt is on the page: when it was copied, where its first
    attempt ran, and which attempt won (or that both still run, in the stragglers table too)."""
    from zephyr.status.server import FileSource

    record = _two_stage_record(tmp_path)
    record["speculation"] = "past 3x the median finished shard and 10s, once 75% of the stage is done"
    copy = {"shard": 7, "source": "in-7.jsonl", "first_attempt": 1, "second_attempt": 2, "ran_s": 31.5, "threshold_s": 12.0,
            "at_s": 40.0, "first_node": "a1b2c3d4e5f6a7b8", "winner": 2, "won_by": "second", "failed_attempts": []}
    running = {**copy, "shard": 9, "source": "in-9.jsonl", "winner": None, "won_by": None, "failed_attempts": [2]}
    record["stages"][0]["second_attempts"] = [copy]
    record["stages"][1]["second_attempts"] = [running]
    record["stages"][1]["stragglers"] = [{"shard": 9, "source": "in-9.jsonl", "attempt": 1, "elapsed_s": 50.0, "waiting": False,
                                          "second_attempt": True}]
    with start_dashboard(source=FileSource(record)) as page:
        dom = Elements(browse(chromium, page.url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000"))
    (row,) = dom.find(data_copy="0/7")
    assert "in-7.jsonl" in row and "31.5 s" in row and "12.0 s" in row and "a1b2c3d4e5f6" in row
    assert dom.find(data_outcome="0/7") == ["attempt 2 (the second) won"]
    assert dom.find(data_outcome="1/9") == ["attempt 2 failed; running"]
    assert dom.find(data_stage=0, data_field="second_attempts") == ["1 (1 won by the second)"]
    assert dom.find(data_straggler="1/9")[0].endswith("running")  # its second attempt runs
    assert dom.find(id="speculation-policy") == [f"Second attempts: {record['speculation']}."]
