"""Bounded parallelism (observed, on every backend) and streaming memory."""

import time
import tracemalloc

import pytest

from zephyr import Dataset, create_backend


def _interval(items):
    start = time.time()
    for _ in items:
        pass
    time.sleep(0.3)
    return [(start, time.time())]


def max_overlap(intervals):
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda ev: (ev[0], ev[1]))
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize("backend_name", ["threadpool", pytest.param("ray", marks=pytest.mark.ray)])
def test_never_more_than_max_parallelism_shards_at_once(backend_name, request):
    if backend_name == "ray":
        request.getfixturevalue("ray_shared")
    # tasks ask for a quarter CPU so Ray alone would run 8 at once on 2 CPUs: the window must hold it to 3
    backend = create_backend(backend_name, max_parallelism=3, num_cpus=0.25, progress=False)
    try:
        intervals = list(backend.execute(Dataset.from_list(list(range(12))).map_shard(_interval)))
    finally:
        backend.close()
    assert len(intervals) == 12
    peak = max_overlap(intervals)
    assert peak <= 3
    assert peak >= 2  # and it did run shards concurrently


def test_sync_runs_one_at_a_time():
    backend = create_backend("sync", progress=False)
    intervals = list(backend.execute(Dataset.from_list(list(range(3))).map_shard(_interval)))
    assert max_overlap(intervals) == 1


def test_shard_memory_does_not_grow_with_shard_size(tmp_path):
    """~200 MB of records stream through map -> filter -> write in a few MB of Python memory."""
    record = "x" * 1000

    def generate(_):
        for i in range(200_000):
            yield {"i": i, "text": record}

    ds = Dataset.from_list([0]).flat_map(generate).map(lambda r: {**r, "n": len(r["text"])}).filter(lambda r: r["i"] % 3)
    backend = create_backend("sync", progress=False)
    tracemalloc.start()
    try:
        [path] = list(backend.execute(ds.write_jsonl(str(tmp_path / "big.jsonl.zst"))))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024, f"peak traced memory {peak / 1e6:.1f} MB for a ~200 MB shard"
    reread = Dataset.from_list([path]).load_jsonl().map(lambda r: 1)
    tracemalloc.start()
    try:
        total = sum(backend.execute(reread.map_shard(lambda it: [sum(it)])))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 133_333
    assert peak < 20 * 1024 * 1024


def test_max_parallelism_must_be_positive():
    with pytest.raises(ValueError, match="max_parallelism must be a positive integer, got 0"):
        create_backend("threadpool", max_parallelism=0)
    with pytest.raises(ValueError, match="Unknown backend 'spark'; choose one of sync, threadpool, ray"):
        create_backend("spark")


def test_tasks_carry_small_descriptors_whatever_the_number_of_shards(tmp_path):
    """Tasks get a path and indices; the stage program (shipped once) does not grow with shards."""
    import pickle

    import cloudpickle

    from zephyr.execution.runner import Execution

    for i in range(2000):
        (tmp_path / f"part-{i:05d}.jsonl").write_bytes(b'{"text": "' + b"x" * 2000 + b'"}\n')
    backend = create_backend("sync", progress=False)

    def sizes(pattern):
        ds = Dataset.from_files(str(tmp_path / pattern)).load_jsonl().map(lambda r: r).write_jsonl(str(tmp_path / "o" / "{shard}.jsonl"))
        execution = Execution(backend, ds)
        stage = execution.plan.stages[0]
        tasks = execution._tasks(stage, None)
        return len(tasks), max(len(pickle.dumps(t)) for t in tasks), len(cloudpickle.dumps(execution.programs[0]))

    few, many = sizes("part-0000[0-9].jsonl"), sizes("part-*.jsonl")
    assert (few[0], many[0]) == (10, 2000)
    assert many[1] < 600  # a file path and a few integers, not the 2 KB of data in the file
    assert many[2] == few[2]  # the shared program is the same size for 10 or 2,000 shards
