"""Resume never reuses stale work (issue 21, 2): a run that failed after its scatter, rerun with
changed code, computes what the new code computes; rerun unchanged, it resumes; where the
code's identity cannot be established the stage never resumes, and says so."""

import functools
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, create_backend
from zephyr.plan.fingerprint import fingerprint, identify
from zephyr.execution.summary import format_summary
from zephyr.execution.scratch import OWNER_NAME

FAIL_FLAG = {"path": None}  # a file whose existence makes `flaky_sum` fail (after the scatter)
FACTOR = 2


def flaky_sum(key, items):
    if FAIL_FLAG["path"] and os.path.exists(FAIL_FLAG["path"]):
        raise RuntimeError("reduce fails while the flag file exists")
    return (key, sum(items))


def _times_two(x):
    return x * 2


def _plus_seven(x):
    return x + 7


_times_two.__qualname__ = _plus_seven.__qualname__ = _times_two.__name__ = _plus_seven.__name__ = "transform"
BODIES = [_times_two, _plus_seven]  # one name, two bodies: an edited module-level function
transform = _times_two


class Scale:
    """A callable object holding a lambda (pickle cannot pickle it: the old fallback was its type name)."""

    def __init__(self, k):
        self.fn = lambda x: x * k

    def __call__(self, x):
        return self.fn(x)


class Keep:
    """A callable object holding a set: pickled in hash order, it differed per process."""

    def __init__(self, residues):
        self.residues = set(residues)

    def __call__(self, x):
        return x if x % 5 in self.residues else -x


def _scaler(k):
    return lambda x: x * k


def _with_default(k):
    def f(x, k=k):
        return x * k

    return f


def _with_kwdefault(k):
    def f(x, *, k=k):
        return x * k

    return f


def _partial(k):
    def mul(x, k):  # a local function: pickle refuses it, so the old fallback hashed 'partial'
        return x * k

    return functools.partial(mul, k=k)


def _global_constant(k):
    global FACTOR
    FACTOR = k
    return lambda x: x * FACTOR


def _body(k):
    global transform
    transform = BODIES[k % 2]
    return transform


# each kind of code change: version k of a map function, and what it computes in plain Python
KINDS = {
    "body": (_body, lambda k: (lambda x: x * 2) if k % 2 == 0 else (lambda x: x + 7)),
    "global_constant": (_global_constant, lambda k: lambda x: x * k),
    "closure": (_scaler, lambda k: lambda x: x * k),
    "default": (_with_default, lambda k: lambda x: x * k),
    "keyword_default": (_with_kwdefault, lambda k: lambda x: x * k),
    "partial": (_partial, lambda k: lambda x: x * k),
    "callable_state": (Scale, lambda k: lambda x: x * k),
    "set_in_callable": (lambda k: Keep({k % 5, (k + 2) % 5}), lambda k: lambda x: x if x % 5 in {k % 5, (k + 2) % 5} else -x),
}


def _pipeline(items, fn):
    return Dataset.from_list(items).map(fn).group_by(lambda v: v % 3, flaky_sum, num_output_shards=2)


def _oracle(items, fn):
    """A clean run of `fn`, in plain Python."""
    sums = {}
    for x in items:
        v = fn(x)
        sums[v % 3] = sums.get(v % 3, 0) + v
    return sorted(sums.items())


def _crash_then_rerun(scratch, items, make, first, second, backend_name="sync"):
    """Run with `make(first)` until the reducer fails (after the scatter), then rerun with
    `make(second)`, made only then (a global constant is read when the code runs)."""
    flag = Path(scratch) / "fail"
    flag.write_text("")
    FAIL_FLAG["path"] = str(flag)
    backend = create_backend(backend_name, progress=False, scratch_dir=f"{scratch}/s")
    try:
        with pytest.raises(Exception, match="flag file exists"):
            list(backend.execute(_pipeline(items, make(first))))
        assert list(Path(scratch).rglob("map-*.json")), "the first run must fail after its scatter"
        flag.unlink()
        execution = backend.execute(_pipeline(items, make(second)))
        return sorted(execution), execution
    finally:
        FAIL_FLAG["path"] = None


@pytest.mark.parametrize("kind", ["callable_state", "partial", "set_in_callable"])
def test_resumed_shuffle_does_not_reuse_map_output_of_changed_code(tmp_path, kind):
    """Regression (issue 21, 2): a callable object's state and a partial's arguments fell back
    to the bare type name, so a rerun with the changed function reused the old map output."""
    make, meaning = KINDS[kind]
    items = list(range(12))
    got, execution = _crash_then_rerun(tmp_path, items, make, 1, 3)
    assert got == _oracle(items, meaning(3))
    assert execution.counters["zephyr/map_shards_resumed"] == 0


def test_a_scratch_folder_named_with_brackets_resumes(tmp_path):
    """Regression: finished map shards were found by globbing `<scratch root>/map-*.json`, so
    under a folder like `run[1]/` none was found and a rerun redid every map shard."""
    make, meaning = KINDS["callable_state"]
    items = list(range(6))
    scratch = tmp_path / "run[1]"
    scratch.mkdir()
    got, execution = _crash_then_rerun(scratch, items, make, 2, 2)
    assert got == _oracle(items, meaning(2))
    assert execution.counters["zephyr/map_shards_resumed"] == len(items)


@settings(max_examples=40, deadline=None)
@given(
    backend_name=st.sampled_from(["sync", "threadpool"]),
    kind=st.sampled_from(sorted(KINDS)),
    items=st.lists(st.integers(-50, 50), min_size=1, max_size=6),
    versions=st.lists(st.integers(1, 9), min_size=2, max_size=2, unique=True),
    same=st.booleans(),
)
def test_oracle_crash_after_scatter_change_code_rerun(backend_name, kind, items, versions, same):
    """Property: crash after the scatter, rerun with changed code (or the same code, rebuilt):
    the result equals a clean run of the new code; unchanged code resumes every map shard."""
    make, meaning = KINDS[kind]
    old, new = (versions[0], versions[0]) if same else versions
    if kind == "body" and not same and old % 2 == new % 2:
        new = old + 1  # two bodies only: a different version must pick the other one
    try:
        with tempfile.TemporaryDirectory() as scratch:
            got, execution = _crash_then_rerun(scratch, items, make, old, new, backend_name)
    finally:
        _global_constant(2), _body(0)
    assert got == _oracle(items, meaning(new))
    resumed = execution.counters["zephyr/map_shards_resumed"]
    assert resumed == (len(items) if same else 0)


def test_identity_covers_each_kind_of_state():
    """Unit view of the same promise, including what the oracle cannot vary cheaply."""
    for kind, (make, _) in KINDS.items():
        try:
            assert fingerprint(make(2)) == fingerprint(make(2)), kind
            assert fingerprint(make(2)) != fingerprint(make(3)), kind
        finally:
            _global_constant(2), _body(0)
    assert fingerprint(Scale(2).__call__) != fingerprint(Scale(3).__call__)  # bound methods

    class Call:  # a changed `__call__` body under the same class name
        def __call__(self, x):
            return x

    first = Call

    class Call:  # noqa: F811
        def __call__(self, x):
            return -x

    assert fingerprint(first()) != fingerprint(Call())
    assert fingerprint("a".startswith) != fingerprint("b".startswith)
    np = pytest.importorskip("numpy")
    assert fingerprint(np.arange(3)) == fingerprint(np.arange(3)) != fingerprint(np.arange(1, 4))
    pa = pytest.importorskip("pyarrow")
    assert fingerprint(pa.table({"a": [1]})) == fingerprint(pa.table({"a": [1]})) != fingerprint(pa.table({"a": [2]}))


SETS_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from zephyr import Dataset
    from test_resume_identity import Keep, flaky_sum
    ds = Dataset.from_list([1, 2]).map(Keep({"the", "a", "of", "and", "to", "in", 3, 4.5})).group_by(lambda v: v, flaky_sum)
    print([s.fingerprint for s in ds.plan().stages])
    """
)


def test_objects_holding_sets_fingerprint_the_same_in_every_process():
    """Regression (issue 21, 2): an object holding a set was pickled in hash order, so its
    fingerprint changed with PYTHONHASHSEED and such runs never resumed."""
    outputs = {
        subprocess.run([sys.executable, "-c", SETS_SCRIPT, os.path.dirname(__file__)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1 and outputs.pop().startswith("[")


RESUME_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, create_backend

    class Scale:
        def __init__(self, k, words):
            self.k, self.words = k, set(words)
            self.fn = lambda x: x * k

        def __call__(self, x):
            return self.fn(x) + len(self.words)

    def reducer(key, items):
        if os.environ.get("DIE_IN_REDUCE"):
            os._exit(9)  # the driver dies between scatter and reduce
        return {"k": key, "sum": sum(items)}

    k = int(os.environ["K"])
    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[2])
    ds = Dataset.from_list(list(range(6))).map(Scale(k, ["x", "y", "z", "w", "v"])).group_by(lambda v: v % 2, reducer)
    execution = backend.execute(ds.write_jsonl(sys.argv[1] + "/part-{shard}.jsonl"))
    list(execution)
    print("resumed", execution.counters["zephyr/map_shards_resumed"])
    """
)


@pytest.mark.parametrize("k_rerun", [2, 5])
def test_across_processes_unchanged_code_resumes_and_changed_code_does_not(tmp_path, k_rerun):
    """A driver killed after its scatter, rerun in a new process (another hash seed): the
    same code resumes all 6 map shards; a changed callable's state redoes them. Either way
    the outputs equal a clean run of the code of the rerun, and no scratch is left."""
    script = tmp_path / "job.py"
    script.write_text(RESUME_SCRIPT)
    out, scratch = tmp_path / "out", tmp_path / "scratch"

    def run(k, seed, **env):
        return subprocess.run([sys.executable, str(script), str(out), str(scratch)], capture_output=True, text=True,
                              env={**os.environ, "K": str(k), "PYTHONHASHSEED": seed, **env}, timeout=120)

    assert run(2, "1", DIE_IN_REDUCE="1").returncode == 9
    assert list(scratch.rglob("map-*.json")) and list(scratch.rglob(OWNER_NAME))
    rerun = run(k_rerun, "2")
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed {6 if k_rerun == 2 else 0}" in rerun.stdout
    import json

    rows = [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
    expected = {}
    for x in range(6):
        v = x * k_rerun + 5
        expected[v % 2] = expected.get(v % 2, 0) + v
    assert {r["k"]: r["sum"] for r in rows} == expected
    assert not any(scratch.iterdir())  # the older run's scratch went too


@pytest.mark.filterwarnings("ignore::zephyr.NotPicklableWarning")
def test_unidentifiable_capture_never_resumes_and_says_so(tmp_path, caplog):
    """A stage capturing a lock has no identity: the run works, warns naming the stage and
    where the lock was found, reports it in the summary, status and run record, removes its
    scratch even though it failed, and its rerun redoes the map shards."""
    lock = threading.Lock()

    def locked(x):
        with lock:
            return x

    assert not identify(("map", locked)).resumable
    assert fingerprint(locked) != fingerprint(locked)  # never collides, not even with itself
    flag = tmp_path / "fail"
    flag.write_text("")
    FAIL_FLAG["path"] = str(flag)
    scratch = tmp_path / "scratch"
    backend = create_backend("sync", progress=False, scratch_dir=str(scratch))

    def pipeline():
        return _pipeline(list(range(5)), locked).map(lambda kv: {"k": kv[0], "sum": kv[1]}).write_jsonl(str(tmp_path / "out/p-{shard}.jsonl"))

    try:
        with caplog.at_level(logging.WARNING, logger="zephyr"):
            failed = backend.execute(pipeline())
            with pytest.raises(Exception, match="flag file exists"):
                list(failed)
        assert "stage 0 cannot be resumed" in caplog.text and "closure cell 'lock'" in caplog.text
        assert "_thread.lock" in caplog.text
        assert failed.status.snapshot()["not_resumable"][0]["stage"] == 0
        assert failed.counters["zephyr/shuffle_records"] == 5  # the scatter ran before the reducer failed
        assert not list(scratch.rglob("map-*.json")) and not list(scratch.rglob(OWNER_NAME))  # removed although it failed
        flag.unlink()
        execution = backend.execute(pipeline())
        list(execution)
    finally:
        FAIL_FLAG["path"] = None
    assert execution.counters["zephyr/map_shards_resumed"] == 0
    assert "not resumable: stage 0" in format_summary(execution) and "closure cell 'lock'" in format_summary(execution)
    from zephyr.status.record import read_run_record
    from zephyr.status.terminal import format_snapshot

    record = read_run_record(str(tmp_path / "out"))
    assert [item["stage"] for item in record["not_resumable"]] == [0]
    assert "not resumable: stage 0" in format_snapshot(record)


@pytest.mark.parametrize("store", ["local", "memory", "gcs"])
def test_a_successful_run_removes_older_scratch_of_the_same_pipeline_only(tmp_path, store, request):
    """Scratch made by an older identity of this pipeline (same output) goes when a run
    succeeds; another pipeline's scratch in the same scratch dir stays, as does the scratch of
    a pipeline that returns its results (it cannot tell its own older scratch apart)."""
    from zephyr.io.files import url_to_fs

    roots_at = {"local": lambda: str(tmp_path / "scratch"), "memory": lambda: f"memory://scratch-{os.getpid()}-{tmp_path.name}",
                "gcs": lambda: f"{request.getfixturevalue('gcs_bucket')}/scratch"}
    scratch = roots_at[store]()
    fs, base = url_to_fs(scratch)

    def names():
        return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)} if fs.exists(base) else set()

    items = list(range(6))

    def write(fn, out):
        return _pipeline(items, fn).map(lambda kv: {"k": kv[0], "sum": kv[1]}).write_jsonl(str(tmp_path / out / "p-{shard}.jsonl"))

    flag = tmp_path / "fail"
    FAIL_FLAG["path"] = str(flag)
    backend = create_backend("sync", progress=False, scratch_dir=scratch)
    try:
        flag.write_text("")
        roots = {}
        for name, ds in (("out", write(Scale(1), "out")), ("other", write(Scale(5), "other")), ("results", _pipeline(items, Scale(7)))):
            with pytest.raises(Exception, match="flag file exists"):
                list(backend.execute(ds))
            roots[name] = (names() - set(roots.values())).pop()
        flag.unlink()
        list(backend.execute(write(Scale(4), "out")))  # the code changed: the older scratch of "out" is stale
        assert names() == {roots["other"], roots["results"]}
        list(backend.execute(_pipeline(items, Scale(4))))  # no output: other roots are left alone
        assert names() == {roots["other"], roots["results"]}
        other = backend.execute(write(Scale(5), "other"))
        list(other)
        assert other.counters["zephyr/map_shards_resumed"] == len(items)  # resumed its own, then removed it
        assert names() == {roots["results"]}
    finally:
        FAIL_FLAG["path"] = None
        if store != "local" and fs.exists(base):
            fs.rm(base, recursive=True)


def test_functions_of_a_script_without_a_file_count_by_their_code():
    """`python -c` and notebooks run in a `__main__` with no file: not a library, so a
    redefined function with another body is other work."""
    script = textwrap.dedent(
        """
        from zephyr.plan.fingerprint import fingerprint
        def f(x): return x + 1
        first = fingerprint(f)
        def f(x): return x + 2
        print(first != fingerprint(f))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr


def test_decorated_and_nested_objects_count_by_what_they_hold():
    import enum

    def cached_plus(n):
        @functools.lru_cache
        def f(x):  # pickled by reference: identity comes from the function it wraps
            return x + n

        return f

    assert fingerprint(cached_plus(1)) != fingerprint(cached_plus(2))

    class Mode(enum.Enum):
        FAST = 1
        SLOW = 2

    assert fingerprint(Mode.FAST) == fingerprint(Mode.FAST) != fingerprint(Mode.SLOW)
    deep = []
    for _ in range(300):
        deep = [deep]
    reason = identify(("map(fn)", deep)).reason
    assert reason.startswith("map(fn) -> item 0") and "nested deeper" in reason


def test_older_scratch_that_a_live_run_uses_is_left_alone(tmp_path):
    """Regression (found merging the identity and lease work): a root marked with this
    pipeline's output but shared, through an explicit scratch_dir, with another pipeline's live
    run was removed under that run. Now a root whose scratch lease is live stays, and a dead
    holder's lease files go with the root."""
    from zephyr.execution.run_lock import RunLocks
    from zephyr.execution.scratch import mark_root, remove_older_roots

    scratch = tmp_path / "scratch"
    root = str(scratch / "fp0")
    owner = {"output": str(tmp_path / "out"), "pattern": "p-{shard}.jsonl"}
    mark_root(root, owner, "fp0")
    other_run = RunLocks(None, [root])
    other_run.acquire()
    try:
        assert remove_older_roots(str(scratch), owner, keep=set()) == []
        assert (scratch / "fp0" / "owner.json").exists()
    finally:
        other_run.release()
    # a holder that dies holding the lease (its files stay): its root is older scratch again
    died = subprocess.run([sys.executable, "-c", f"import os; from zephyr.execution.run_lock import RunLocks; "
                           f"RunLocks(None, [{root!r}]).acquire(); os._exit(0)"], capture_output=True, text=True, timeout=120)
    assert died.returncode == 0, died.stderr
    lease_dir = scratch / ".fp0.zephyr-lease"
    assert any(lease_dir.iterdir())  # the fault landed: the dead holder's lease is there
    removed = remove_older_roots(str(scratch), owner, keep=set())
    assert [p.rsplit("/", 1)[-1] for p in removed] == ["fp0"]
    assert not (scratch / "fp0").exists() and not lease_dir.exists()
