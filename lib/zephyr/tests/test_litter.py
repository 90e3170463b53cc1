"""No litter: a successful run leaves nothing but its outputs; temporaries of killed runs (their
owner process dead) are removed by a later run, while a live run's are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import fsspec
import pytest

from zephyr import Dataset, create_backend
from zephyr.status import RECORD_NAME  # the run record: an output of every run, by design

ROWS_PER_SHARD = 200


def rows(i):
    return [{"k": f"key{(i * 7 + j) % 50}", "i": i, "j": j} for j in range(ROWS_PER_SHARD)]


def count(key, items):
    return {"k": key, "n": sum(1 for _ in items)}


def shuffle_pipeline(out: str) -> Dataset:
    # 10 map shards each give every reduce shard one run: more than a 4 MiB task merges at
    # once, so the reduce side goes through intermediate runs in a private temp folder too
    return Dataset.from_list(list(range(10))).flat_map(rows).group_by(lambda r: r["k"], count, num_output_shards=2).write_jsonl(
        out + "/part-{shard}.jsonl"
    )


@pytest.mark.parametrize("name", ["sync", "threadpool"])
def test_a_successful_shuffle_leaves_nothing_but_its_outputs(tmp_path, private_tmp, name):
    """Regression: the default scratch folder `.zephyr-scratch` stayed beside the output, empty."""
    out = tmp_path / "out"
    backend = create_backend(name, memory="4MiB", progress=False)
    execution = backend.execute(shuffle_pipeline(str(out)))
    assert len(list(execution)) == 2
    assert execution.counters["zephyr/merge_passes"] >= 1  # the merge folder was used
    assert sorted(p.name for p in out.iterdir()) == sorted([RECORD_NAME, "part-0.jsonl", "part-1.jsonl"])
    assert list(private_tmp.iterdir()) == []  # no merge folder, no upload file


def test_a_skip_existing_run_leaves_its_outputs_each_with_the_record_of_its_input(tmp_path, private_tmp):
    """Only skip_existing writers leave a hidden `.<name>.zephyr-source.json` beside each
    output (which input made it); no lease or scratch is left either way."""
    out = tmp_path / "out"
    ds = Dataset.from_list(list(range(10))).flat_map(rows).group_by(lambda r: r["k"], count, num_output_shards=2)
    list(create_backend("sync", progress=False).execute(ds.write_jsonl(str(out / "part-{shard}.jsonl"), skip_existing=True)))
    parts = ["part-0.jsonl", "part-1.jsonl"]
    assert sorted(p.name for p in out.iterdir()) == sorted([RECORD_NAME, *parts, *(f".{p}.zephyr-source.json" for p in parts)])
    assert list(private_tmp.iterdir()) == []


@pytest.mark.ray
def test_a_successful_shuffle_on_ray_leaves_nothing_beside_its_outputs(tmp_path, ray_shared):
    out = tmp_path / "out"
    backend = create_backend("ray", max_parallelism=4, memory="4MiB", progress=False)
    assert len(list(backend.execute(shuffle_pipeline(str(out))))) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == sorted([RECORD_NAME, "part-0.jsonl", "part-1.jsonl"])


def test_a_successful_run_to_object_storage_leaves_nothing_but_its_outputs(gcs_bucket, private_tmp):
    backend = create_backend("threadpool", memory="4MiB", progress=False)
    assert len(list(backend.execute(shuffle_pipeline(f"{gcs_bucket}/out")))) == 2
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    bucket = gcs_bucket.removeprefix("gs://")
    assert sorted(fs.find(bucket)) == sorted([f"{bucket}/out/{RECORD_NAME}", f"{bucket}/out/part-0.jsonl", f"{bucket}/out/part-1.jsonl"])  # no scratch objects
    assert list(private_tmp.iterdir()) == []  # every staged upload removed


@pytest.mark.parametrize("store", ["local", "memory", "gs"])
def test_a_shuffle_into_a_folder_named_with_brackets_leaves_nothing_but_its_outputs(request, tmp_path, private_tmp, store):
    """Regression: scratch was removed with `fs.rm`, which globs a path holding "[", so into
    `out[1]/` on an object store (or memory://) the run logged "could not remove scratch" and
    left every run file of the shuffle behind."""
    base = {"local": str(tmp_path / "base"), "memory": "memory://litter-brackets"}.get(store) or request.getfixturevalue("gcs_bucket")
    out = f"{base}/out[1]"
    backend = create_backend("sync", memory="4MiB", progress=False)
    assert len(list(backend.execute(shuffle_pipeline(out)))) == 2
    fs, root = fsspec.core.url_to_fs(base)
    fs.invalidate_cache()
    try:
        assert sorted(p.rsplit("/out[1]/", 1)[-1] for p in fs.find(root)) == sorted([RECORD_NAME, "part-0.jsonl", "part-1.jsonl"])
    finally:
        if store == "memory":
            fs.rm(root, recursive=True)


def test_an_explicit_scratch_dir_is_emptied_but_kept(tmp_path):
    scratch = tmp_path / "scratch"
    backend = create_backend("sync", progress=False, scratch_dir=str(scratch))
    list(backend.execute(shuffle_pipeline(str(tmp_path / "out"))))
    assert scratch.is_dir() and list(scratch.iterdir()) == []  # the user's folder, not ours to remove


HOLD_AN_UPLOAD = textwrap.dedent(
    """
    import time
    from zephyr.io import atomic_write

    with atomic_write("memory://litter/out.bin") as f:
        f.write(b"half of it")
        print("WRITING", flush=True)
        time.sleep(600)
    """
)

KILLED_IN_A_MERGE = textwrap.dedent(
    """
    import sys, time
    from zephyr import Dataset, create_backend

    def rows(i):
        return [{"k": j % 50, "i": i} for j in range(200)]

    def stuck(key, items):
        print("MERGING", flush=True)
        time.sleep(600)

    ds = Dataset.from_list(list(range(10))).flat_map(rows).group_by(lambda r: r["k"], stuck, num_output_shards=1)
    list(create_backend("sync", memory="4MiB", progress=False, scratch_dir=sys.argv[1]).execute(ds))
    """
)


@pytest.fixture
def processes(background):
    """Start Python scripts that are killed after the test, whatever happens in it."""
    return lambda script, *args, env: background([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, text=True)


def test_temporaries_of_killed_writers_are_swept_by_the_next_run_and_a_live_writers_kept(
    tmp_path, private_tmp, processes, wait_for_line
):
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    killed_upload = processes(HOLD_AN_UPLOAD, env=env)
    live_upload = processes(HOLD_AN_UPLOAD, env=env)
    killed_merge = processes(KILLED_IN_A_MERGE, str(tmp_path / "scratch"), env=env)
    for proc, line in ((killed_upload, "WRITING"), (live_upload, "WRITING"), (killed_merge, "MERGING")):
        wait_for_line(proc, line)
    left = {p.name for p in private_tmp.iterdir()}
    assert {name.split("@")[0] for name in left} == {
        f"zephyr-upload-{killed_upload.pid}", f"zephyr-upload-{live_upload.pid}", f"zephyr-merge-{killed_merge.pid}"
    }
    for proc in (killed_upload, killed_merge):  # preempted: no chance to clean up
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL  # the kill landed mid-write (the scripts sleep there)
    assert {p.name for p in private_tmp.iterdir()} == left  # the litter

    list(create_backend("sync", progress=False).execute(Dataset.from_list([1]).map(str)))  # any later run

    assert [p.name.split("@")[0] for p in private_tmp.iterdir()] == [f"zephyr-upload-{live_upload.pid}"]
