"""skip_existing knows which input made which output (issue 21, defect 5).

Regression: outputs were matched to inputs by position, so a run over inputs b, c, then a
rerun after adding a, left outputs holding b, c, c: a was lost, with exit 0. Every test here
compares the output directory with a plain-Python oracle of a clean run over the inputs now.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephyr import Dataset, create_backend
from zephyr.execution.provenance import SIDECAR_SUFFIX, StaleOutputsError
from zephyr.status import RECORD_NAME


def double(record):
    return {"name": record["name"], "v": record["v"] * 2}


def pipeline(inputs: Path, out: Path, pattern: str = "part-{shard}.jsonl") -> Dataset:
    return Dataset.from_files(f"{inputs}/*.jsonl").load_jsonl().map(double).write_jsonl(f"{out}/{pattern}", skip_existing=True)


def write_input(inputs: Path, name: str, values: list[int], *, in_place: bool = False) -> None:
    """One input file; rewritten in place (same inode) or replaced (a new file), as tools do."""
    path = inputs / f"{name}.jsonl"
    text = "".join(orjson.dumps({"name": name, "v": v}).decode() + "\n" for v in values)
    if in_place:
        with open(path, "w") as f:
            f.write(text)
        return
    tmp = inputs / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


def oracle(contents: dict[str, list[int]], name_of=lambda i, n: f"part-{i}.jsonl") -> dict[str, list[dict]]:
    """A clean run, in plain Python: one output per input file in sorted name order."""
    names = sorted(contents)
    return {name_of(i, len(names)): [{"name": n, "v": v * 2} for v in contents[n]] for i, n in enumerate(names)}


def outputs(out: Path) -> dict[str, list[dict]]:
    """What a reader of the output directory sees (hidden files and the run record aside)."""
    return {
        p.name: [orjson.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(out.iterdir())
        if not p.name.startswith(".") and p.name != RECORD_NAME
    }


def run(backend, inputs, out, pattern="part-{shard}.jsonl"):
    execution = backend.execute(pipeline(inputs, out, pattern))
    list(execution)
    return execution


@pytest.fixture
def dirs(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    return inputs, out


def test_an_input_added_before_the_others_is_processed_not_lost(backend, dirs):
    """Regression (defect 5): b, c, then a added: the outputs held b, c, c and a was lost."""
    inputs, out = dirs
    contents = {"b": [1, 2], "c": [3]}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(backend, inputs, out)
    assert outputs(out) == oracle(contents)
    contents["a"] = [10, 20, 30]
    write_input(inputs, "a", contents["a"])
    again = run(backend, inputs, out)
    assert outputs(out) == oracle(contents)
    assert again.counters["zephyr/shards_skipped_existing"] == 0  # every shard's input moved
    third = run(backend, inputs, out)
    assert third.counters["zephyr/shards_skipped_existing"] == 3  # and now all are current
    assert outputs(out) == oracle(contents)


def test_an_input_rewritten_in_place_is_recomputed_and_the_others_kept(local_backend, dirs):
    inputs, out = dirs
    contents = {"a": [1], "b": [2], "c": [3]}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out)
    contents["b"] = [7, 8, 9]  # another size, so even a coarse clock tells the versions apart
    write_input(inputs, "b", contents["b"], in_place=True)
    again = run(local_backend, inputs, out)
    assert outputs(out) == oracle(contents)
    assert again.counters["zephyr/shards_skipped_existing"] == 2


def truncate(path: Path) -> None:
    """Cut a file to half its size, as a damaged copy or an interrupted tool leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_output_is_made_again_and_the_others_kept(local_backend, dirs):
    """Regression: a skip_existing rerun kept an output cut short since it was written (its
    sidecar matched the input), recorded the damaged size, and `zephyr verify` then passed."""
    from zephyr.cli import main as zephyr_main

    inputs, out = dirs
    contents = {"a": list(range(50)), "b": list(range(40)), "c": [3]}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out)
    truncate(out / "part-1.jsonl")
    again = run(local_backend, inputs, out)
    assert again.counters["zephyr/shards_skipped_existing"] == 2  # a and c kept, b made again
    assert outputs(out) == oracle(contents)
    assert zephyr_main(["verify", str(out)]) == 0


def test_after_a_shuffle_a_truncated_final_output_is_made_again(local_backend, tmp_path):
    """The whole-run check (every final output current: skip the shuffle) sees sizes too."""
    out = tmp_path / "out"

    def totals():
        return (Dataset.from_list([list(range(i, 300, 3)) for i in range(3)]).flat_map(lambda xs: xs)
                .group_by(lambda x: x % 4, lambda k, xs: {"k": k, "n": sum(xs)}, num_output_shards=2)
                .write_jsonl(f"{out}/part-{{shard}}.jsonl", skip_existing=True))

    list(local_backend.execute(totals()))
    expected = outputs(out)
    truncate(out / "part-0.jsonl")
    again = local_backend.execute(totals())
    list(again)
    assert outputs(out) == expected
    assert again.counters["zephyr/shards_skipped_existing"] == 1


def a_local_jsonl(path: str) -> bool:
    return path.endswith(".jsonl") and "://" not in path


def test_listed_paths_filtered_before_the_loader_keep_their_versions(local_backend, dirs):
    """Regression: `from_list(paths).filter(...).load_jsonl()` gave its shards no file versions
    (only a loader right after the source did), so a rewritten input kept its stale output (and
    a shuffle after it would have been reused). A listed string that is no path at all
    (`nowhere://c`, filtered out) does not stop the planning."""
    inputs, out = dirs
    for name, values in {"a": [1], "b": [2]}.items():
        write_input(inputs, name, values)
    paths = [str(inputs / "a.jsonl"), str(inputs / "b.jsonl"), "nowhere://c"]

    def listed() -> Dataset:
        return (Dataset.from_list(paths).filter(a_local_jsonl).load_jsonl().map(double)
                .write_jsonl(f"{out}/part-{{shard}}.jsonl", skip_existing=True))

    fingerprint = listed().plan().stages[0].fingerprint
    list(local_backend.execute(listed()))
    before = outputs(out)
    assert before["part-0.jsonl"] == [{"name": "a", "v": 2}] and before["part-1.jsonl"] == [{"name": "b", "v": 4}]
    write_input(inputs, "b", [7, 8, 9], in_place=True)  # another size: any clock tells the versions apart
    assert listed().plan().stages[0].fingerprint != fingerprint
    again = local_backend.execute(listed())
    list(again)
    assert outputs(out) == {**before, "part-1.jsonl": [{"name": "b", "v": v * 2} for v in (7, 8, 9)]}
    assert again.counters["zephyr/shards_skipped_existing"] == len(before) - 1  # all but b's


def test_a_removed_input_stops_the_run_naming_the_output_and_its_input(local_backend, dirs):
    inputs, out = dirs
    for name, values in {"a": [1], "b": [2], "c": [3]}.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out)
    before = outputs(out)
    (inputs / "b.jsonl").unlink()
    with pytest.raises(StaleOutputsError) as caught:
        run(local_backend, inputs, out)
    message = str(caught.value)
    assert f"{out}/part-2.jsonl (made from {inputs}/c.jsonl)" in message
    assert "Delete those outputs" in message and "another directory" in message
    assert outputs(out) == before  # stopped before doing anything
    (out / "part-2.jsonl").unlink()  # as the message says
    run(local_backend, inputs, out)
    assert outputs(out) == oracle({"a": [1], "c": [3]})
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(SIDECAR_SUFFIX)) == [
        f".part-0.jsonl{SIDECAR_SUFFIX}", f".part-1.jsonl{SIDECAR_SUFFIX}"]  # the orphan record went too


def test_a_shard_count_change_with_a_total_in_the_name_stops_the_run(local_backend, dirs):
    inputs, out = dirs
    pattern = "{shard:05d}-of-{total:05d}.jsonl"
    contents = {"b": [1], "c": [2]}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out, pattern)
    write_input(inputs, "a", [5])
    with pytest.raises(StaleOutputsError, match=r"00000-of-00002.jsonl \(made from .*b.jsonl\).*00001-of-00002.jsonl"):
        run(local_backend, inputs, out, pattern)
    for p in out.glob("*-of-00002.jsonl"):
        p.unlink()
    run(local_backend, inputs, out, pattern)
    contents["a"] = [5]
    assert outputs(out) == oracle(contents, lambda i, n: f"{i:05d}-of-{n:05d}.jsonl")


@pytest.mark.parametrize("pattern", ["{shard}/part.jsonl", "{basename}/part.jsonl"])
def test_a_removed_input_stops_the_run_when_a_field_names_the_directory(local_backend, dirs, pattern):
    """Regression: only the directories this run writes were searched for earlier outputs, so
    with `out/{shard}/part.jsonl` a removed input's output (`out/2/...`, made from c, now shard
    1's) stayed beside the new ones: readers of `out/*/part.jsonl` saw c twice."""
    inputs, out = dirs
    for name, values in {"a": [1], "b": [2], "c": [3]}.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out, pattern)
    (inputs / "b.jsonl").unlink()
    gone = pattern.format(shard=2, basename="b")
    made_from = inputs / ("c.jsonl" if "shard" in pattern else "b.jsonl")
    with pytest.raises(StaleOutputsError, match=re.escape(f"{out}/{gone} (made from {made_from})")):
        run(local_backend, inputs, out, pattern)
    (out / gone).unlink()  # as the message says
    run(local_backend, inputs, out, pattern)
    found = {str(p.relative_to(out)): [orjson.loads(line) for line in p.read_text().splitlines()] for p in out.glob("*/part.jsonl")}
    assert found == {pattern.format(shard=i, basename=n): [{"name": n, "v": v * 2}] for i, (n, v) in enumerate([("a", 1), ("c", 3)])}


def test_a_rerun_into_a_folder_named_with_brackets_keeps_its_outputs(local_backend, tmp_path):
    """Regression: the driver read the sidecars with `fs.cat`, which globs its paths, so every
    skip_existing rerun into a folder like `out[1]/` failed with FileNotFoundError naming them."""
    inputs, out = tmp_path / "in", tmp_path / "out[1]"
    inputs.mkdir()
    contents = {"a": [1], "b": [2, 3]}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(local_backend, inputs, out)
    again = run(local_backend, inputs, out)
    assert again.counters["zephyr/shards_skipped_existing"] == 2
    assert outputs(out) == oracle(contents)


def test_outputs_of_other_code_from_the_same_input_are_kept_and_counted(local_backend, dirs, caplog):
    inputs, out = dirs
    write_input(inputs, "a", [1])
    run(local_backend, inputs, out)
    other = Dataset.from_files(f"{inputs}/*.jsonl").load_jsonl().map(lambda r: {"other": True}).write_jsonl(
        f"{out}/part-{{shard}}.jsonl", skip_existing=True)
    execution = local_backend.execute(other)
    list(execution)
    assert execution.counters["zephyr/outputs_kept_other_code"] == 1
    assert outputs(out) == oracle({"a": [1]})  # kept: rerunning after a fix is what skip_existing is for
    assert "made by other code" in caplog.text


def test_outputs_without_provenance_are_kept_with_a_warning(local_backend, dirs, caplog):
    inputs, out = dirs
    write_input(inputs, "a", [1])
    out.mkdir()
    (out / "part-0.jsonl").write_text('{"by": "hand"}\n')
    execution = run(local_backend, inputs, out)
    assert execution.counters["zephyr/outputs_kept_without_provenance"] == 1
    assert outputs(out) == {"part-0.jsonl": [{"by": "hand"}]}
    assert "no record of the input" in caplog.text


def count_values(name, records):
    values = [r["v"] for r in records]
    return {"name": name, "n": len(values), "total": sum(values)}


def test_after_a_shuffle_an_added_input_reruns_the_upstream(local_backend, dirs):
    """Regression: with every final output present the whole upstream was skipped."""
    inputs, out = dirs
    contents = {"a": [1, 2], "b": [3]}
    for name, values in contents.items():
        write_input(inputs, name, values)

    def ds():
        return (Dataset.from_files(f"{inputs}/*.jsonl").load_jsonl().group_by(lambda r: r["name"], count_values, num_output_shards=1)
                .write_jsonl(f"{out}/groups-{{shard}}.jsonl", skip_existing=True))

    list(local_backend.execute(ds()))
    contents["c"] = [4, 5, 6]
    write_input(inputs, "c", contents["c"])
    execution = local_backend.execute(ds())
    list(execution)
    assert execution.counters["zephyr/stages_skipped_outputs_exist"] == 0
    (written,) = outputs(out).values()
    assert sorted(written, key=lambda r: r["name"]) == [
        {"name": n, "n": len(v), "total": sum(v)} for n, v in sorted(contents.items())]
    assert local_backend.execute(ds()) and list(local_backend.execute(ds()))  # current now: runs again fine


NAMES = list(string.ascii_lowercase[:5])
actions = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "rewrite"]), st.sampled_from(NAMES), st.lists(st.integers(-5, 5), max_size=3)),
    min_size=1, max_size=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=st.sets(st.sampled_from(NAMES), min_size=1), steps=actions)
def test_any_sequence_of_input_changes_gives_a_clean_runs_outputs_or_stops_naming_them(tmp_path_factory, initial, steps):
    """Oracle: after each change, the outputs equal a clean run over the inputs now, or the
    run stops, changing nothing, naming exactly the outputs whose shard no longer exists."""
    base = tmp_path_factory.mktemp("changes")
    inputs, out = base / "in", base / "out"
    inputs.mkdir()
    backend = create_backend("sync", progress=False)
    contents = {name: [i] for i, name in enumerate(sorted(initial))}
    for name, values in contents.items():
        write_input(inputs, name, values)
    run(backend, inputs, out)
    for action, name, values in steps:
        if action == "remove" and name in contents and len(contents) > 1:
            del contents[name]
            (inputs / f"{name}.jsonl").unlink()
        elif action != "remove":
            contents[name] = values + [len(contents)]
            write_input(inputs, name, contents[name])
        present = set(outputs(out))
        extra = {f"part-{i}.jsonl" for i in range(len(contents), 10)} & present  # shards no plan writes now
        if extra:
            before = outputs(out)
            with pytest.raises(StaleOutputsError) as caught:
                run(backend, inputs, out)
            assert outputs(out) == before
            for output in extra:
                assert f"{out}/{output} (made from" in str(caught.value)
                (out / output).unlink()
        run(backend, inputs, out)
        assert outputs(out) == oracle(contents)


def test_on_object_storage_an_added_input_is_processed_and_a_removed_one_stops_the_run(gcs_bucket):
    """The same on GCS (the emulator): listings, sidecar reads and the lease go through gcsfs."""
    import fsspec

    fs = fsspec.filesystem("gs")
    inputs, out = f"{gcs_bucket}/in", f"{gcs_bucket}/out"

    def put(name, values):
        fs.pipe_file(f"{inputs}/{name}.jsonl", "".join(orjson.dumps({"name": name, "v": v}).decode() + "\n" for v in values).encode())

    def read_outputs():
        fs.invalidate_cache()
        return {p.rsplit("/", 1)[-1]: [orjson.loads(line) for line in fs.cat_file(p).decode().splitlines()]
                for p in sorted(fs.ls(out, detail=False)) if not p.rsplit("/", 1)[-1].startswith(".")
                and not p.endswith(RECORD_NAME)}

    backend = create_backend("threadpool", progress=False)
    contents = {"b": [1], "c": [2, 3]}
    for name, values in contents.items():
        put(name, values)
    list(backend.execute(pipeline(inputs, out)))
    contents["a"] = [4]
    put("a", contents["a"])
    fs.invalidate_cache()
    list(backend.execute(pipeline(inputs, out)))
    assert read_outputs() == oracle(contents)
    fs.rm_file(f"{inputs}/a.jsonl".removeprefix("gs://"))
    fs.invalidate_cache()
    with pytest.raises(StaleOutputsError, match=r"out/part-2.jsonl \(made from gs://.*/in/c.jsonl\)"):
        list(backend.execute(pipeline(inputs, out)))
    assert not any(".zephyr-lease" in p for p in fs.find(gcs_bucket.removeprefix("gs://")))  # released after the stop
