"""Each dedup says what it removed (issue 38): the end-of-run summary, the status snapshot (the
page and `zephyr status`) and the run record give every `deduplicate` and `deduplicate_fuzzy`
its documents in, out and removed, checked against counts made here from the raw input files
(lines, distinct texts, and an all-pairs Jaccard oracle for the near duplicates)."""

from __future__ import annotations

import json
import pathlib

import pytest

from lib.zephyr.tests.test_first_in_input import near_copy_corpus, write_shards
from lib.zephyr.tests.test_fuzzy_dedup import oracle_keep
from zephyr import Dataset, create_backend
from zephyr.execution.summary import format_summary
from zephyr.status import read_run_record, start_dashboard
from zephyr.status.terminal import format_snapshot


def _text(record):
    return record["text"]


def independent_counts(source_dir: pathlib.Path) -> dict:
    """From the files themselves: lines in, distinct texts, and near-duplicate clusters among
    the first copies of each text (in file order)."""
    shards = [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(source_dir.glob("in-*.jsonl"))]
    seen: set = set()
    firsts = [[r for r in shard if not (r["text"] in seen or seen.add(r["text"]))] for shard in shards]
    kept, _ = oracle_keep(firsts)
    return {"lines": sum(map(len, shards)), "distinct": len(seen), "clusters": len(kept)}


def applied(record: dict) -> int:
    """The stage of the record that applies the fuzzy dedup's labels: after the signature stage
    (1), the bucket stage and the component rounds, as many as the run added (it says how many)."""
    stages = [st["index"] for st in record["stages"] if "apply_labels" in st["description"]]
    rounds = [st for st in record["stages"] if "round " in st["description"]]
    assert len(stages) == 1 and stages[0] == 3 + len(rounds) and len(rounds) >= 1, stages
    return stages[0]


def expected_section(n: dict, last: int, annotate: bool = False) -> list[dict]:
    """The report: the exact dedup in stages 0-1, the fuzzy one from stage 1 to `last`."""
    fuzzy_out = n["distinct"] if annotate else n["clusters"]
    return [
        {"op": "deduplicate(_text)", "kind": "exact", "stages": [0, 1], "documents_in": n["lines"],
         "documents_out": n["distinct"], "removed": n["lines"] - n["distinct"]},
        {"op": "deduplicate_fuzzy(_text)", "kind": "fuzzy", "stages": [1, last], "documents_in": n["distinct"],
         "documents_out": fuzzy_out, "removed": n["distinct"] - fuzzy_out, "duplicates": n["distinct"] - n["clusters"]},
    ]


def pipeline(source: str, out: pathlib.Path, annotate: bool = False, then=None) -> Dataset:
    ds = Dataset.from_files(source).load_jsonl().deduplicate(_text).deduplicate_fuzzy(_text, annotate=annotate)
    return (ds.map(then) if then is not None else ds).write_jsonl(str(out / "part-{shard}.jsonl"))


def written_records(out: pathlib.Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in out.glob("part-*.jsonl"))


def test_summary_status_and_record_give_each_dedups_documents_in_out_and_removed(backend, tmp_path, http_json):
    source = write_shards(tmp_path, near_copy_corpus(11))
    n = independent_counts(tmp_path)
    assert n["lines"] > n["distinct"] > n["clusters"]  # both dedups remove something
    out = tmp_path / "out"
    execution = backend.execute(pipeline(source, out))
    list(execution)
    assert written_records(out) == n["clusters"]

    last = applied(read_run_record(str(out)))
    assert last == 3 + execution.counters["zephyr/cc_rounds"]
    want = expected_section(n, last)
    assert read_run_record(str(out))["dedups"] == want
    summary = format_summary(execution)
    assert (f"dedup deduplicate(_text) (stages 0-1): documents {n['lines']:,} in, {n['distinct']:,} out, "
            f"{n['lines'] - n['distinct']:,} removed") in summary
    assert (f"dedup deduplicate_fuzzy(_text) (stages 1-{last}): documents {n['distinct']:,} in, {n['clusters']:,} out, "
            f"{n['distinct'] - n['clusters']:,} removed") in summary
    with start_dashboard() as page:
        assert http_json(page.url + f"api/snapshot?run={execution.status.run_id}")["dedups"] == want
    assert f"dedup deduplicate_fuzzy(_text) (stages 1-{last})" in format_snapshot(read_run_record(str(out)))


def test_annotate_removes_nothing_and_counts_the_duplicates_it_marked(tmp_path):
    source = write_shards(tmp_path, near_copy_corpus(12, num_shards=3))
    n = independent_counts(tmp_path)
    out = tmp_path / "out"
    list(create_backend("sync", progress=False).execute(pipeline(source, out, annotate=True)))
    record = read_run_record(str(out))
    assert record["dedups"] == expected_section(n, applied(record), annotate=True)
    assert written_records(out) == n["distinct"]


class FailOnce:
    """A map that raises in the first run (which then leaves its scatter work behind)."""

    def __init__(self, flag: pathlib.Path):
        self.flag = str(flag)

    def __call__(self, record):
        if not pathlib.Path(self.flag).exists():
            pathlib.Path(self.flag).touch()
            raise RuntimeError("first run fails in its last stage")
        return record


def test_a_resumed_run_counts_each_dedup_once(tmp_path):
    source = write_shards(tmp_path, near_copy_corpus(13))
    n = independent_counts(tmp_path)
    out = tmp_path / "out"
    ds = pipeline(source, out, then=FailOnce(tmp_path / "failed-once"))
    backend = create_backend("sync", progress=False, max_user_retries=0, scratch_dir=str(tmp_path / "scratch"))
    with pytest.raises(Exception, match="first run fails"):
        list(backend.execute(ds))
    execution = backend.execute(ds)
    list(execution)
    record = read_run_record(str(out))
    last = applied(record)
    assert [st["shards"]["resumed"] for st in record["stages"]][:last] == [4] * last  # it did resume, rounds too
    assert record["dedups"] == expected_section(n, last)
    assert written_records(out) == n["clusters"]
    (tmp_path / "flag-set").touch()  # an uninterrupted run of the same pipeline writes the same bytes
    clean = tmp_path / "clean"
    list(create_backend("sync", progress=False).execute(pipeline(source, clean, then=FailOnce(tmp_path / "flag-set"))))
    assert {p.name: p.read_bytes() for p in out.glob("part-*")} == {p.name: p.read_bytes() for p in clean.glob("part-*")}
