"""put(name, obj) / get_shared(name), and in-process backends running unpicklable functions."""

import os
import threading
import warnings

import pytest

from zephyr import Dataset, NotPicklableWarning, create_backend, get_shared


class Blocklist:
    """A stand-in for a large read-only object; counts how often it is unpickled (per process)."""

    loads = 0

    def __init__(self, words):
        self.words = frozenset(words)

    def __contains__(self, word):
        return word in self.words

    def __setstate__(self, state):
        type(self).loads += 1
        self.__dict__.update(state)


class OnceBlocklist(Blocklist):
    """Its own unpickle counter: only the Ray object-store test uses it."""

    loads = 0


def keep(word):
    return word not in get_shared("blocklist")


def where_and_which(_):
    shared = get_shared("blocklist")
    return (os.getpid(), id(shared), type(shared).loads)


def test_put_and_get_shared_on_every_backend(backend):
    backend.put("blocklist", Blocklist({"spam", "scam"}))
    words = ["ham", "spam", "eggs", "scam", "toast"]
    assert list(backend.execute(Dataset.from_list([words[:3], words[3:]]).flat_map(list).filter(keep))) == ["ham", "eggs", "toast"]
    # a later run on the same backend sees it too, and a new put replaces it
    backend.put("blocklist", Blocklist({"ham"}))
    assert list(backend.execute(Dataset.from_list(words).filter(keep))) == ["spam", "eggs", "scam", "toast"]


def test_local_backends_share_the_very_object(local_backend):
    blocklist = Blocklist({"x"})
    local_backend.put("blocklist", blocklist)
    seen = list(local_backend.execute(Dataset.from_list(range(4)).map(lambda _: get_shared("blocklist"))))
    assert all(obj is blocklist for obj in seen)


@pytest.mark.ray
def test_ray_ships_the_object_once_through_the_object_store(ray_shared):
    backend = create_backend("ray", max_parallelism=2, progress=False)
    try:
        backend.put("blocklist", OnceBlocklist({f"w{i}" for i in range(100_000)}))
        execution = backend.execute(Dataset.from_list(list(range(24))).map(where_and_which))
        seen = list(execution)
        program_bytes = len(__import__("cloudpickle").dumps(execution.programs[0]))
    finally:
        backend.close()
    per_process = {}
    for pid, obj_id, loads in seen:
        per_process.setdefault(pid, set()).add((obj_id, loads))
    assert all(len(objs) == 1 for objs in per_process.values())  # fetched once per worker process...
    assert all(loads == 1 for objs in per_process.values() for _, loads in objs)  # ... and unpickled once
    assert program_bytes < 10_000  # the stage program does not carry the object


def test_get_shared_errors_are_clear(local_backend):
    with pytest.raises(LookupError, match="works inside the tasks of a pipeline"):
        get_shared("model")
    local_backend.put("model", object())
    with pytest.raises(Exception, match="no shared object named 'tokenizer'; the backend has: 'model'"):
        list(local_backend.execute(Dataset.from_list([1]).map(lambda _: get_shared("tokenizer"))))
    with pytest.raises(ValueError, match="non-empty name"):
        local_backend.put("", 1)


_LOCK = threading.Lock()


@pytest.mark.parametrize("name", ["sync", "threadpool"])
def test_in_process_backends_run_unpicklable_functions_and_warn_once(name):
    counts = {}

    def count_under_lock(x):  # captures a lock and a dict: cannot be pickled
        with _LOCK:
            counts[x] = counts.get(x, 0) + 1
        return x * 2

    backend = create_backend(name, max_parallelism=2, progress=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = list(backend.execute(Dataset.from_list(list(range(6))).map(count_under_lock)))
            second = list(backend.execute(Dataset.from_list(list(range(6))).map(count_under_lock)))
    finally:
        backend.close()
    assert first == second == [0, 2, 4, 6, 8, 10] and counts == {i: 2 for i in range(6)}
    mine = [w for w in caught if issubclass(w.category, NotPicklableWarning)]
    assert len(mine) == 1  # once, although the pipeline ran twice
    assert "count_under_lock" in str(mine[0].message) and "will not run on the ray backend" in str(mine[0].message)


@pytest.mark.parametrize("name", ["sync", "threadpool"])
def test_in_process_backends_pickle_a_pipeline_once_to_check_it(name, monkeypatch):
    """Review: every execution cloudpickled every stage program (a captured model included)
    only to decide whether to warn; in-process a stage that pickled is checked once."""
    import cloudpickle

    pickled: list[object] = []
    real_dumps = cloudpickle.dumps

    def counting_dumps(obj, *args, **kwargs):
        pickled.append(obj)
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(cloudpickle, "dumps", counting_dumps)
    model = {"weights": list(range(1000)), "name": name}  # a fresh capture: a fingerprint no other test has
    pipeline = Dataset.from_list([1, 2, 3]).map(lambda x: x * len(model["weights"])).reshard(1)
    backend = create_backend(name, max_parallelism=2, progress=False)
    try:
        assert list(backend.execute(pipeline)) == [1000, 2000, 3000]
        checked = len(pickled)
        assert checked >= 2  # both stages were checked on the first run
        assert list(backend.execute(pipeline)) == [1000, 2000, 3000]
        assert len(pickled) == checked  # not again
    finally:
        backend.close()
