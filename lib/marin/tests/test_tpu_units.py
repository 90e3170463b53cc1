"""Fast tests of marin.tpu that start no Ray: slice table, parsing, resources, lockfile,
token batching, preemption classification and which host reports (JAX on CPU).
Checkpoints: test_tpu_checkpoint.py; the loop on a mesh: test_tpu_mesh.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from marin.tpu import (
    GENERATIONS,
    DataPosition,
    TokenBatches,
    host_resources,
    is_preemption,
    parse_tpu_type,
    remove_tpu_lockfile_on_exit,
    resolve_shards,
    tpu_resources,
    valid_tpu_types,
)

# ---- slice table and resources --------------------------------------------------------------


@pytest.mark.parametrize(
    "tpu_type, chips, hosts, chips_per_host",
    [
        ("v4-8", 4, 1, 4),
        ("v4-16", 8, 2, 4),
        ("v4-32", 16, 4, 4),
        ("v4-4096", 2048, 512, 4),
        ("v5litepod-1", 1, 1, 1),
        ("v5litepod-4", 4, 1, 4),
        ("v5litepod-8", 8, 1, 8),
        ("v5litepod-16", 16, 4, 4),
        ("v5litepod-256", 256, 64, 4),
        ("v5p-8", 4, 1, 4),
        ("v5p-16", 8, 2, 4),
        ("v5p-12288", 6144, 1536, 4),
        ("v6e-1", 1, 1, 1),
        ("v6e-4", 4, 1, 4),
        ("v6e-8", 8, 1, 8),
        ("v6e-16", 16, 4, 4),
        ("v6e-256", 256, 64, 4),
    ],
)
def test_slice_table(tpu_type, chips, hosts, chips_per_host):
    spec = parse_tpu_type(tpu_type)
    assert (spec.chips, spec.num_hosts, spec.chips_per_host) == (chips, hosts, chips_per_host)
    assert spec.is_multi_host == (hosts > 1)
    assert spec.head_resource == f"TPU-{tpu_type}-head"


@pytest.mark.parametrize(
    "tpu_type, expected",
    [
        ("v4-8", {"TPU": 4, "TPU-v4-8-head": 1}),
        ("v5litepod-4", {"TPU": 4, "TPU-v5litepod-4-head": 1}),
        ("v5litepod-8", {"TPU": 8, "TPU-v5litepod-8-head": 1}),
        ("v5p-8", {"TPU": 4, "TPU-v5p-8-head": 1}),
        ("v6e-8", {"TPU": 8, "TPU-v6e-8-head": 1}),
        ("v4-16", {"TPU": 4, "TPU-v4-16-head": 1}),  # host 0's share of a two-host slice
    ],
)
def test_tpu_resources_request_chips_and_head(tpu_type, expected):
    assert tpu_resources(tpu_type) == {"num_cpus": 1, "resources": expected}
    assert tpu_resources(tpu_type, num_cpus=8)["num_cpus"] == 8


def test_host_resources_use_the_slice_name():
    assert host_resources("v6e-16", "my-slice") == {"num_cpus": 1, "resources": {"TPU": 4, "my-slice": 1}}
    with pytest.raises(ValueError, match="slice_name"):
        host_resources("v6e-16", "")


def test_v5e_alias_and_normalisation():
    assert parse_tpu_type("v5e-8").tpu_type == "v5litepod-8"
    assert parse_tpu_type(" V4-8 ").tpu_type == "v4-8"


def test_every_generation_lists_its_types():
    assert set(GENERATIONS) == {"v4", "v5e", "v5p", "v6e"}
    assert valid_tpu_types("v6e")[:3] == ("v6e-1", "v6e-4", "v6e-8")
    assert "v4-8" in valid_tpu_types() and "v5litepod-256" in valid_tpu_types()
    for tpu_type in valid_tpu_types():
        assert parse_tpu_type(tpu_type).tpu_type == tpu_type
    with pytest.raises(ValueError, match="valid generations: v4, v5e"):
        valid_tpu_types("v7")


@pytest.mark.parametrize(
    "bad, message",
    [
        ("v4_8", "Malformed TPU type 'v4_8'.*Valid generations: v4, v5e \\(v5litepod-N\\), v5p, v6e"),
        ("v4-", "Malformed"),
        ("tpu", "Malformed"),
        ("v9-8", "Unknown TPU generation 'v9'.*valid generations"),
        ("v4-12", "Invalid size 12 for TPU generation v4.*v4-8, v4-16"),
        ("v6e-2", "Invalid size 2 for TPU generation v6e.*v6e-1, v6e-4, v6e-8"),
        ("v5litepod-3", "valid v5e types: v5litepod-1"),
    ],
)
def test_parse_errors_list_valid_choices(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_tpu_type(bad)


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError, match="must be a string"):
        parse_tpu_type(8)


# ---- lockfile -------------------------------------------------------------------------------


def test_lockfile_removed_by_decorator_even_on_error(tmp_path):
    lock = tmp_path / "libtpu_lockfile"

    @remove_tpu_lockfile_on_exit(path=str(lock))
    def work(fail):
        lock.write_text("held")
        if fail:
            raise RuntimeError("boom")
        return 7

    assert work(False) == 7 and not lock.exists()
    with pytest.raises(RuntimeError, match="boom"):
        work(True)
    assert not lock.exists()
    assert work.__name__ == "work"


def test_lockfile_bare_decorator_uses_env_path(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    monkeypatch.setenv("MARIN_LIBTPU_LOCKFILE", str(lock))

    @remove_tpu_lockfile_on_exit
    def work():
        lock.write_text("held")

    work()
    assert not lock.exists()


def test_lockfile_context_manager_safe_when_absent(tmp_path):
    lock = tmp_path / "never-created"
    with remove_tpu_lockfile_on_exit(path=str(lock)):
        pass
    assert not lock.exists()
    with remove_tpu_lockfile_on_exit(path=str(lock)):
        lock.write_text("held")
    assert not lock.exists()


def test_preemption_classification():
    from ray.exceptions import NodeDiedError, RayTaskError, WorkerCrashedError

    assert is_preemption(WorkerCrashedError())
    assert is_preemption(NodeDiedError("node gone"))
    assert not is_preemption(ValueError("user bug"))
    wrapped = RayTaskError("run", "traceback", WorkerCrashedError())
    assert is_preemption(wrapped)
    assert not is_preemption(RayTaskError("run", "traceback", ValueError("bug")))


def test_preemption_is_zephyrs_lost_task_for_every_ray_error():
    """Regression: the TPU runner and Zephyr's Ray backend each had a list of "lost" Ray errors
    and they differed (a full disk or object store and a dropped RPC: lost for Zephyr, a user
    failure here; a cancelled task: lost for Zephyr only). One list now, in zephyr; its table
    oracle is lib/zephyr/tests/test_ray_errors.py."""
    import ray.exceptions
    from zephyr.backends.ray_errors import is_lost

    def made(name):
        cls = getattr(ray.exceptions, name)
        return cls.__new__(cls)

    for name in ("OutOfDiskError", "ObjectStoreFullError", "RpcError", "NodeDiedError", "ActorUnavailableError"):
        assert is_preemption(made(name)), name
    for name in ("OutOfMemoryError", "TaskCancelledError", "ObjectFreedError", "RaySystemError"):
        assert not is_preemption(made(name)), name
    for name, cls in vars(ray.exceptions).items():
        if isinstance(cls, type) and issubclass(cls, BaseException):
            assert is_preemption(made(name)) == is_lost(made(name)), name


# ---- data -----------------------------------------------------------------------------------


@pytest.fixture
def shards(tmp_path):
    """Three shards (plain, zstd, gzip JSONL) whose tokens count up 0, 1, 2, ... across them."""
    from zephyr.io import write_jsonl_file

    lengths = [[3, 5, 0, 4], [7, 1], [6, 2, 2]]
    next_token, paths = 0, []
    for i, (record_lengths, ext) in enumerate(zip(lengths, ["jsonl", "jsonl.zst", "jsonl.gz"], strict=True)):
        records = []
        for n in record_lengths:
            records.append({"input_ids": list(range(next_token, next_token + n)), "text": "x"})
            next_token += n
        path = str(tmp_path / f"part-{i}.{ext}")
        write_jsonl_file(records, path)
        paths.append(path)
    return paths, next_token


def test_batches_pack_tokens_in_sorted_shard_order_and_wrap(shards, tmp_path):
    paths, total = shards
    resolved = resolve_shards(str(tmp_path / "part-*"))
    assert resolved == sorted(paths)
    batches = TokenBatches(resolved, batch_size=2, seq_len=5)
    stream = np.concatenate([next(batches).ravel() for _ in range(5)])  # 50 tokens, 30 per epoch
    np.testing.assert_array_equal(stream, np.arange(50) % total)
    assert next(batches).dtype == np.int32


def test_batches_resume_from_position(shards):
    paths, _ = shards
    straight = TokenBatches(paths, batch_size=3, seq_len=4)
    expected = [next(straight) for _ in range(8)]
    first = TokenBatches(paths, batch_size=3, seq_len=4)
    got = [next(first) for _ in range(3)]
    position = DataPosition.from_dict(json.loads(json.dumps(first.position.to_dict())))
    resumed = TokenBatches(paths, batch_size=3, seq_len=4, position=position)
    got += [next(resumed) for _ in range(5)]
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_parquet_shards(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [[1, 2, 3], [4, 5, 6, 7]]}), tmp_path / "a.parquet")
    batches = TokenBatches(resolve_shards([str(tmp_path / "a.parquet")]), batch_size=1, seq_len=7)
    np.testing.assert_array_equal(next(batches), [[1, 2, 3, 4, 5, 6, 7]])


# Every name zephyr's readers take (lib/zephyr/src/zephyr/io/formats.py), written by zephyr's own writers.
ZEPHYR_SHARD_NAMES = ["a.jsonl", "a.ndjson", "a.json", "a.jsonl.gz", "a.jsonl.gzip", "a.ndjson.zst", "a.json.zstd",
                      "a.JSONL.ZST", "a.parquet", "a.parquet.zst"]


@pytest.mark.parametrize("name", ZEPHYR_SHARD_NAMES)
def test_the_training_reader_reads_every_shard_name_zephyr_reads(tmp_path, name):
    """Regression: the training reader had its own suffix list and refused .ndjson, .jsonl.gzip,
    .json.zstd (and .parquet.zst), which zephyr writes and reads."""
    from zephyr import Dataset, create_backend

    records = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7]}, {"input_ids": [8, 9]}]
    write = "write_parquet" if ".parquet" in name.lower() else "write_jsonl"
    pattern = str(tmp_path / name.replace("a.", "a-{shard}.", 1))
    dataset = getattr(Dataset.from_iterable(records), write)(pattern)
    [path] = list(create_backend("sync", progress=False).execute(dataset))
    assert resolve_shards(str(tmp_path / "a-*")) == [path]
    batches = TokenBatches([path], batch_size=2, seq_len=3)
    np.testing.assert_array_equal(next(batches), [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(next(batches), [[7, 8, 9], [1, 2, 3]])  # then the next epoch


@pytest.mark.parametrize("name", ["notes.txt", "a.csv.gz", "a.jsonl.lz4", "a.zst"])
def test_the_training_reader_refuses_what_zephyr_refuses(tmp_path, name):
    from zephyr.readers import format_for

    (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError) as zephyr_error:
        format_for(str(tmp_path / name))
    with pytest.raises(ValueError) as ours:
        resolve_shards(str(tmp_path / name))
    assert str(ours.value) == str(zephyr_error.value) and name in str(ours.value)


def test_data_errors(tmp_path, shards):
    paths, _ = shards
    with pytest.raises(FileNotFoundError, match="no shards match"):
        resolve_shards(str(tmp_path / "missing-*.jsonl"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="Cannot tell the format of .*notes.txt"):
        resolve_shards(str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="no token field 'tokens'.*input_ids"):
        next(TokenBatches(paths, batch_size=1, seq_len=2, field="tokens"))
    with pytest.raises(ValueError, match="batch_size and seq_len must be positive"):
        TokenBatches(paths, batch_size=0, seq_len=2)


# ---- which host reports --------------------------------------------------------------------


@pytest.mark.parametrize(
    "process_count, process_index, host_id, writes",
    [
        (4, 0, "2", True),  # multi-host JAX: process 0 writes even if its bundle index is not 0
        (4, 2, "0", False),  # ... and bundle 0 does not, unless it is process 0
        (4, 1, "1", False),
        (1, 0, "0", True),  # one JAX process per host: run_on_tpu's host 0 writes
        (1, 0, "1", False),
    ],
)
def test_reporting_host_selection(monkeypatch, process_count, process_index, host_id, writes):
    """Bug 2: the reporter had to be both JAX process 0 and MARIN_TPU_HOST_ID 0; on a real
    multi-host slice these can disagree and then no host reported."""
    jax = pytest.importorskip("jax")
    from marin.training import train

    monkeypatch.setattr(jax, "process_count", lambda: process_count)
    monkeypatch.setattr(jax, "process_index", lambda: process_index)
    monkeypatch.setenv("MARIN_TPU_HOST_ID", host_id)
    assert train._is_reporting_host() is writes


def test_train_on_tpu_returns_process_0s_result(monkeypatch):
    """Bug 2: train_on_tpu returned results[0], not necessarily JAX process 0's."""
    from marin.training import TrainResult, train

    def fake_run_on_tpu(fn, tpu_type, **kwargs):
        results = []
        for host, process_index in ((0, 1), (1, 0)):  # bundle order differs from JAX's
            monkeypatch.setenv("MARIN_TPU_HOST_ID", str(host))
            monkeypatch.setattr(train, "_is_reporting_host", lambda p=process_index: p == 0)
            results.append(fn())
        return results

    from marin.tpu import runner

    monkeypatch.setattr(runner, "run_on_tpu", fake_run_on_tpu)
    monkeypatch.setattr(train, "train_loop", lambda *a, **k: TrainResult(step=int(os.environ["MARIN_TPU_HOST_ID"]),
                                                                           checkpoint_path="x"))
    result = train.train_on_tpu(None, None, "data", tpu_type="v4-16", batch_size=1, seq_len=1, num_steps=1,
                                checkpoint_path="x")
    assert result.step == 1  # host 1 is JAX process 0, the reporter


def test_user_actor_errors_inside_fn_are_not_preemption():
    """Bug 6: the classifier followed the RayTaskError cause chain to any depth, so an
    ActorDiedError/ObjectLostError from the user's own actors inside fn counted as a
    preemption (a deterministic bug retried up to 100 times)."""
    from ray.exceptions import ActorDiedError, ObjectLostError, RayTaskError, WorkerCrashedError

    def nested(cause):  # driver <- slice actor's run() <- host task _run_on_host() <- fn's error
        host = RayTaskError("_run_on_host", "traceback", cause).as_instanceof_cause()
        return RayTaskError("_SliceHolder.run", "traceback", host)

    assert not is_preemption(nested(ActorDiedError()))
    assert not is_preemption(nested(ObjectLostError("ab" * 14, b"", "")))
    assert not is_preemption(nested(WorkerCrashedError()))
    # our own host task's worker/node died (depth 1) or our slice actor died (depth 0)
    assert is_preemption(RayTaskError("_SliceHolder.run", "traceback", WorkerCrashedError()).as_instanceof_cause())
    assert is_preemption(ActorDiedError())
    # max_depth=0: only the awaited task/actor itself
    assert not is_preemption(RayTaskError("step", "traceback", ActorDiedError()), max_depth=0)
    assert is_preemption(WorkerCrashedError(), max_depth=0)


def test_jax_process_ids_follow_the_tpu_worker_number(monkeypatch):
    """On a TPU VM the TPU runtime's worker number decides JAX's process id (the bundle index
    of the placement group need not match the topology); off TPUs the bundle order does."""
    from marin.tpu import runner

    monkeypatch.delenv("TPU_WORKER_ID", raising=False)
    monkeypatch.setattr(runner.glob, "glob", lambda pattern: [])  # no TPU chips on this host
    assert runner._process_id(5) == 5
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    monkeypatch.setenv("MARIN_TPU_SLICE_ID", "2")
    monkeypatch.setenv("MARIN_TPU_NUM_HOSTS", "4")
    assert runner._process_id(5) == 2 * 4 + 1


def test_data_reads_vortex_shards(tmp_path):
    """Issue 25: `.vortex` is a known format, so the training reader must read it as Vortex
    (it used to fall through to the JSON Lines reader)."""
    from zephyr.writers import write_vortex_file

    from marin.tpu.data import read_records

    docs = [[1, 2, 3], [4], [5, 6]]
    path = str(tmp_path / "tokens.vortex")
    write_vortex_file([{"input_ids": d, "other": "x"} for d in docs], path)
    assert list(read_records(path, "input_ids")) == docs


def test_train_loop_runs_on_a_host_without_ray():
    """A single GPU or TPU host trains with `train_loop` alone; only `train_on_tpu` (the slice
    launcher) needs Ray. Ray is made unimportable in a fresh interpreter."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        sys.modules["ray"] = None  # `import ray` now raises ImportError
        from marin.training import TokenBatches, train_loop, tiny_lm
        from marin.training.train import _is_reporting_host
        assert "ray" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
        try:
            from marin.training import train_on_tpu
            train_on_tpu(None, None, "d", tpu_type="v4-8", batch_size=1, seq_len=1, num_steps=1, checkpoint_path="x")
        except ImportError as error:
            print("launcher needs ray:", error)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "launcher needs ray" in done.stdout
