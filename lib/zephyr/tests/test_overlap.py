"""A pipeline whose outputs are among its own inputs is a PlanError before anything runs
(issue 38, 3): a glob over the outputs' folder read them back on every rerun (doubling them;
with skip_existing an output was taken for input, then removed), and `{basename}` into the
input folder replaced the input file itself, each with exit status 0."""

import json
import os
import uuid

import fsspec
import pytest

from zephyr import Dataset, create_backend
from zephyr.errors import PlanError


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _snapshot(root):
    """Every file under `root` and its bytes: what a refused plan must leave as it was."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    (folder / "b.jsonl").write_text('{"id": 3}\n')
    return folder


def test_outputs_a_glob_would_match_are_refused_before_they_exist(data, local_backend):
    """The issue's case: `data/**/*.jsonl` writing `data/clean/`. The outputs do not exist on
    the first run, so only the glob's semantics can tell; nothing is written."""
    before = _snapshot(data)
    ds = Dataset.from_files(f"{data}/**/*.jsonl").load_jsonl().write_jsonl(f"{data}/clean/{{shard:05d}}.jsonl")
    with pytest.raises(PlanError) as error:
        list(local_backend.execute(ds))
    message = str(error.value)
    assert f"{data}/**/*.jsonl" in message and f"{data}/clean/00000.jsonl" in message and "rerun" in message
    assert _snapshot(data) == before and not (data / "clean").exists()


def test_skip_existing_into_the_glob_is_refused_and_keeps_the_outputs(data, local_backend):
    """With outputs already there (as a first run made them), skip_existing used to take one
    for input and then remove it; now the plan is refused and every file stays."""
    list(local_backend.execute(Dataset.from_files(f"{data}/*.jsonl").load_jsonl().write_jsonl(f"{data}/clean/{{shard:05d}}.jsonl")))
    before = _snapshot(data)
    ds = Dataset.from_files(f"{data}/**/*.jsonl").load_jsonl().write_jsonl(f"{data}/clean/{{shard:05d}}.jsonl", skip_existing=True)
    with pytest.raises(PlanError, match="clean/00000.jsonl"):
        list(local_backend.execute(ds))
    assert _snapshot(data) == before


def test_basename_into_the_input_folder_is_refused_and_the_input_kept(data, local_backend):
    before = _snapshot(data)
    ds = Dataset.from_files(f"{data}/*.jsonl").load_jsonl().map(lambda r: {"id": r["id"] * 10}).write_jsonl(f"{data}/{{basename}}.jsonl")
    with pytest.raises(PlanError, match=r"a\.jsonl"):
        list(local_backend.execute(ds))
    assert _snapshot(data) == before
    assert _records(data / "a.jsonl") == [{"id": 1}, {"id": 2}]


def test_a_relative_input_file_and_an_absolute_output_are_one_path(data, local_backend, monkeypatch):
    monkeypatch.chdir(data.parent)
    ds = Dataset.from_files("data/a.jsonl").load_jsonl().write_jsonl(str(data / "a.jsonl"))
    with pytest.raises(PlanError, match="replace its own input"):
        ds.plan()
    relative_out = Dataset.from_files(f"{data}/*.jsonl").load_jsonl().write_jsonl("data/out-{shard}.jsonl")
    with pytest.raises(PlanError, match="out-0.jsonl"):
        relative_out.plan()


def test_a_callable_output_pattern_is_checked_by_the_paths_it_returns(data):
    ds = Dataset.from_files(f"{data}/*.jsonl").load_jsonl().write_jsonl(lambda shard, total: f"{data}/part-{shard}-of-{total}.jsonl")
    with pytest.raises(PlanError, match="part-0-of-2.jsonl"):
        ds.plan()


def test_each_writer_is_checked(data):
    """A second writer (after a shuffle) that writes into the input glob is named."""
    ds = (Dataset.from_files(f"{data}/*.jsonl").load_jsonl().write_jsonl(f"{data.parent}/out/p-{{shard}}.jsonl")
          .reshard(1).map(lambda path: {"path": path}).write_jsonl(f"{data}/index-{{shard}}.jsonl"))
    with pytest.raises(PlanError, match=r"write_jsonl\('.*index-\{shard\}.jsonl'.* writes '.*index-0.jsonl'"):
        ds.plan()


def test_the_right_side_of_a_join_is_an_input_too(tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir(), right.mkdir()
    (left / "l.jsonl").write_text('{"id": 1}\n')
    (right / "r.jsonl").write_text('{"id": 1, "x": 2}\n')
    by_id = lambda r: r["id"]  # noqa: E731
    joined = Dataset.from_files(f"{left}/*.jsonl").load_jsonl().sorted_merge_join(
        Dataset.from_files(f"{right}/*.jsonl").load_jsonl(), by_id, by_id)
    with pytest.raises(PlanError, match=f"{right}/\\*.jsonl"):
        joined.write_jsonl(f"{right}/joined-{{shard}}.jsonl").plan()
    joined.write_jsonl(f"{tmp_path}/joined-{{shard}}.jsonl").plan()  # elsewhere: fine


def test_list_items_a_loader_reads_are_inputs(data):
    paths = [str(data / "a.jsonl"), str(data / "b.jsonl")]
    with pytest.raises(PlanError, match="from_list item"):
        Dataset.from_list(paths).filter(lambda p: True).load_jsonl().write_jsonl(lambda shard, total: paths[shard]).plan()


def test_outputs_beside_the_inputs_that_no_input_matches_run(data, local_backend):
    """Only a match is refused: another extension, or a hidden name (wildcards skip those)."""
    out = list(local_backend.execute(Dataset.from_files(f"{data}/*.jsonl").load_jsonl().write_jsonl(f"{data}/{{basename}}.clean.jsonl.zst")))
    assert sorted(os.path.basename(p) for p in out) == ["a.clean.jsonl.zst", "b.clean.jsonl.zst"]
    from zephyr.io.files import glob_matches

    assert not glob_matches(f"{data}/*.jsonl", f"{data}/.hidden.jsonl")
    assert glob_matches(f"{data}/.*", f"{data}/.hidden.jsonl")


def test_memory_urls_are_checked_and_nothing_is_written():
    root = f"memory://overlap-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{root}/in/a.jsonl", b'{"id": 1}\n')
    try:
        backend = create_backend("sync", progress=False)
        with pytest.raises(PlanError, match=f"{root}/in/sub/0.jsonl"):
            list(backend.execute(Dataset.from_files(f"{root}/in/**/*.jsonl").load_jsonl().write_jsonl(f"{root}/in/sub/{{shard}}.jsonl")))
        assert fs.find(f"{root}/in") == [f"/{root.split('://')[1]}/in/a.jsonl"]
    finally:
        fs.rm(root.split("://")[1], recursive=True)


@pytest.mark.parametrize("pattern, path, expected", [
    ("gs://b/data/**/*.jsonl", "gs://b/data/clean/0.jsonl", True),
    ("gs://b/data/**/*.jsonl", "gcs://b/data/x/y/0.jsonl", True),  # one filesystem, two names
    ("gs://b/data/**/*.jsonl", "gs://b/data/0.jsonl", True),  # ** spans zero folders too
    ("gs://b/data/*.jsonl", "gs://b/data/clean/0.jsonl", False),  # * stays in its folder
    ("gs://b/data/*.jsonl", "gs://other/data/0.jsonl", False),
    ("gs://b/data/*.jsonl", "memory://b/data/0.jsonl", False),
    ("memory://data/*.jsonl", "data/0.jsonl", False),  # a local path is not memory://
    ("nowhere://data/0.jsonl", "nowhere://data/0.jsonl", False),  # not a filesystem: never read as a file
    ("gs://b/data/part-[0-9].jsonl", "gs://b/data/part-7.jsonl", True),
    ("gs://b/data/part-?.jsonl", "gs://b/data/part-12.jsonl", False),
])
def test_glob_semantics_across_protocols(pattern, path, expected):
    from zephyr.io.files import glob_matches

    assert glob_matches(pattern, path) is expected


def test_gcs_inputs_and_outputs_are_checked(gcs_bucket):
    fs = fsspec.filesystem("gs")
    fs.pipe_file(f"{gcs_bucket}/data/a.jsonl", b'{"id": 1}\n')
    fs.invalidate_cache()
    with pytest.raises(PlanError, match=f"{gcs_bucket}/data/\\*\\*/\\*.jsonl"):
        Dataset.from_files(f"{gcs_bucket}/data/**/*.jsonl").load_jsonl().write_jsonl(f"{gcs_bucket}/data/clean/{{shard}}.jsonl").plan()
    Dataset.from_files(f"{gcs_bucket}/data/**/*.jsonl").load_jsonl().write_jsonl(f"{gcs_bucket}/clean/{{shard}}.jsonl").plan()
