"""Plan fingerprints: what a resumed run may reuse. Same code -> same digest in any process;
any change to what a stage computes -> a different digest."""

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from zephyr import Dataset
from zephyr.plan.fingerprint import fingerprint
from zephyr.shuffle.reduce import key_bytes, partition_of

THRESHOLD = 3


def helper(x):
    return x + THRESHOLD


def stage_fingerprints(ds):
    return [s.fingerprint for s in ds.plan().stages]


def base():
    return Dataset.from_list([1, 2, 3]).map(lambda x: helper(x))


def test_changing_the_reducer_changes_the_scatter_it_feeds():
    """Regression: the reducer was not in any fingerprint, so a rerun reused stale shuffle data."""
    summed = base().group_by(lambda x: x % 2, lambda k, items: sum(items)).reshard(2)
    maxed = base().group_by(lambda x: x % 2, lambda k, items: max(items)).reshard(2)
    a, b = stage_fingerprints(summed), stage_fingerprints(maxed)
    assert a[0] == b[0]  # the group_by scatter does not depend on the reducer
    assert a[1] != b[1] and a[2] != b[2]  # the stage that reduces (and all after it) do


def test_module_level_helpers_and_constants_count():
    """Regression: only the names of globals were hashed, not what they refer to."""
    global THRESHOLD
    before = stage_fingerprints(base().reshard(2))
    THRESHOLD = 4
    try:
        assert stage_fingerprints(base().reshard(2)) != before
    finally:
        THRESHOLD = 3
    assert stage_fingerprints(base().reshard(2)) == before


def test_mutually_recursive_helpers_terminate():
    def make():
        def even(n):
            return n == 0 or odd(n - 1)

        def odd(n):
            return n != 0 and even(n - 1)

        return even

    assert fingerprint(make()) == fingerprint(make())


SCRIPT = textwrap.dedent(
    """
    from zephyr import Dataset
    from zephyr.shuffle.reduce import key_bytes, partition_of
    STOP = frozenset({"the", "a", "of", "and", "to", "in"})
    ds = Dataset.from_list([1, 2]).filter(lambda w: w not in STOP).deduplicate(lambda x: x)
    print([s.fingerprint for s in ds.plan().stages], partition_of(key_bytes(frozenset({"x", "y", "z", "w"})), 1000))
    """
)


def test_same_in_every_process_even_with_sets():
    """Regression: sets pickle in hash order, so set keys and captured sets varied per process."""
    outputs = {
        subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1 and outputs.pop().startswith("[")


def test_set_keys_encode_canonically():
    assert key_bytes({"b", "a"}) == key_bytes({"a", "b"})
    assert key_bytes(frozenset(["b", "a"])) == key_bytes(frozenset(["a", "b"]))
    assert key_bytes({"a", "b"}) != key_bytes(frozenset(["a", "b"]))  # keys are equal when types and values are
    assert key_bytes(("x", {3, 1, 2})) == key_bytes(("x", {2, 3, 1}))
    assert partition_of(key_bytes({"a", "b"}), 7) == partition_of(key_bytes({"b", "a"}), 7)


FAIL_FLAG = {"path": None}  # a file whose existence makes `flaky_count` fail (after the scatter)


def flaky_count(key, items):
    if FAIL_FLAG["path"] and os.path.exists(FAIL_FLAG["path"]):
        raise RuntimeError("reduce fails while the flag file exists")
    return {"w": key, "n": sum(1 for _ in items)}


def _word_counts(paths):
    """The oracle: plain Python over the files as they are now."""
    counts = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                w = json.loads(line)["w"]
                counts[w] = counts.get(w, 0) + 1
    return counts


@pytest.mark.parametrize("rewrite", ["same_size", "other_size", "from_list_paths"])
def test_resumed_shuffle_does_not_reuse_map_output_of_rewritten_inputs(tmp_path, rewrite):
    """Regression (issue 21, 6): the fingerprint covered input names, not contents, so a run
    that failed after its scatter, rerun after an input was rewritten in place, reused the old
    map output and wrote the old answer."""
    from zephyr import create_backend

    inputs = [tmp_path / f"in-{i}.jsonl" for i in range(3)]
    for i, path in enumerate(inputs):
        path.write_text("".join(json.dumps({"w": f"w{(i + j) % 4}"}) + "\n" for j in range(20)))
    flag = tmp_path / "fail"
    flag.write_text("")
    FAIL_FLAG["path"] = str(flag)
    scratch = tmp_path / "scratch"
    backend = create_backend("sync", progress=False, scratch_dir=str(scratch))

    def pipeline():
        source = (Dataset.from_list([str(p) for p in inputs]) if rewrite == "from_list_paths"
                  else Dataset.from_files(str(tmp_path / "in-*.jsonl")))
        return source.load_jsonl().group_by(lambda r: r["w"], flaky_count, num_output_shards=2)

    try:
        with pytest.raises(Exception, match="flag file exists"):
            list(backend.execute(pipeline()))
        assert any(scratch.rglob("map-*.json")), "the first run must fail after its scatter"
        # rewrite one input in place: same name, other words (and maybe another size)
        words = "ab" if rewrite == "same_size" else "abc"
        inputs[1].write_text("".join(json.dumps({"w": f"x{words[j % len(words)]}"}) + "\n" for j in range(20)))
        flag.unlink()
        execution = backend.execute(pipeline())
        got = {r["w"]: r["n"] for r in execution}
    finally:
        FAIL_FLAG["path"] = None
    assert got == _word_counts(inputs)
    assert execution.counters["zephyr/map_shards_resumed"] == 0


def test_input_versions_come_from_every_filesystem(tmp_path, gcs_bucket):
    """Each store's listing gives a version that changes when a file is rewritten in place."""
    from zephyr.io.files import expand_glob_versions, file_versions, url_to_fs

    for root in (str(tmp_path), f"memory://versions-{os.getpid()}", gcs_bucket):
        path = f"{root}/a.jsonl"
        fs, fs_path = url_to_fs(path)
        fs.pipe_file(fs_path, b'{"a": 1}\n')
        before = expand_glob_versions(f"{root}/*.jsonl")
        assert len(before) == 1 and before[0][1] == file_versions([path])[path]  # a listing and a lookup agree
        fs.pipe_file(fs_path, b'{"a": 2}\n')  # same size, new content
        fs.invalidate_cache()
        after = expand_glob_versions(f"{root}/*.jsonl")
        assert after[0][1] != before[0][1], (root, before, after)
        assert file_versions([path])[path] == after[0][1]


def test_code_reached_through_a_user_module_counts(tmp_path, monkeypatch):
    """A helper or constant reached as `mod.attr`, or through `import mod` inside the function,
    counts by what it is, not by the module's name: an edit to the module changes the digest
    (it used to leave it, so a rerun reused shuffle output made by the old code). A module not
    imported yet counts by its source file. A library function counts by its name and library
    (an edit to a user module leaves it)."""
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    source = "FACTOR = {factor}\n\ndef scale(x):\n    return x * FACTOR\n"
    (tmp_path / "fp_user_mod.py").write_text(source.format(factor=1))
    (tmp_path / "fp_lazy_mod.py").write_text(source.format(factor=1))
    monkeypatch.delitem(sys.modules, "fp_lazy_mod", raising=False)
    import fp_user_mod

    def by_helper(x):
        return fp_user_mod.scale(x)

    def by_constant(x):
        return x * fp_user_mod.FACTOR

    def by_local_import(x):
        import fp_user_mod as m

        return m.scale(x)

    def by_lazy_import(x):
        import fp_lazy_mod

        return fp_lazy_mod.scale(x)

    functions = [by_helper, by_constant, by_local_import, by_lazy_import, json.dumps]
    try:
        before = [fingerprint(fn) for fn in functions]
        assert before == [fingerprint(fn) for fn in functions]  # stable while nothing changes
        assert "fp_lazy_mod" not in sys.modules  # fingerprinting imported nothing
        (tmp_path / "fp_user_mod.py").write_text(source.format(factor=1000))
        (tmp_path / "fp_lazy_mod.py").write_text(source.format(factor=1000))
        importlib.reload(fp_user_mod)
        after = [fingerprint(fn) for fn in functions]
    finally:
        sys.modules.pop("fp_user_mod", None)
    assert [a != b for a, b in zip(before, after)] == [True, True, True, True, False]


SOURCE = "FACTOR = {factor}\nOFFSET = {offset}\n\ndef scale(x):\n    return x * FACTOR\n"


def _user_module(tmp_path, monkeypatch, name):
    """A module of the user's own, `name`, with FACTOR = 1 and OFFSET = 0 (see `_changes`)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text(SOURCE.format(factor=1, offset=0))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


def _changes(tmp_path, module, digests) -> tuple[list[bool], list[bool]]:
    """Which of `digests()` change when the module's file is edited (FACTOR), then when its
    OFFSET is changed in memory only (the file as it was): any edit of a module the code
    reaches counts (issue 38, 4); a value changed at run time counts where it is read."""
    before = digests()
    assert before == digests()  # stable while nothing changes
    try:
        (tmp_path / f"{module.__name__}.py").write_text(SOURCE.format(factor=1000, offset=0))
        importlib.reload(module)
        edited = digests()
        module.OFFSET = 5
        changed = digests()
    finally:
        sys.modules.pop(module.__name__, None)
    return [a != b for a, b in zip(before, edited)], [a != b for a, b in zip(edited, changed)]


def test_user_module_reached_through_a_class_or_a_container_counts(tmp_path, monkeypatch):
    """A user module held as a class attribute or in a container (`Cfg.mod.scale(x)`,
    `MODS[0].FACTOR`) counts by what the code reads of it, as one held in a global does; and
    two functions of one stage that read different attributes of one module both count (the
    second used to be skipped as a module already seen)."""
    held = _user_module(tmp_path, monkeypatch, "fp_held_mod")

    class Cfg:
        mod = held

    mods = [held]

    def by_class(x):
        return Cfg.mod.scale(x)

    def by_container(x):
        return x * mods[0].FACTOR

    def reads_factor(x):
        return x * held.FACTOR

    def reads_offset(x):
        return x + held.OFFSET

    factor, offset = _changes(tmp_path, held, lambda: [fingerprint(by_class), fingerprint(by_container),
                                                       fingerprint((reads_factor, reads_offset))])
    assert factor == [True, True, True]
    assert offset == [False, False, True]  # only the pair reads OFFSET


def test_user_module_as_a_default_or_held_twice_counts(tmp_path, monkeypatch):
    """A user module passed as a default argument counts by what the function reads of it; one
    held by two classes counts the names each reader reads (the second sighting used to be a
    bare back-reference)."""
    twice = _user_module(tmp_path, monkeypatch, "fp_twice_mod")

    class A:
        mod = twice

    class B:
        mod = twice

    def by_default(x, m=twice):
        return x * m.FACTOR

    def reads_factor(x):
        return x * A.mod.FACTOR

    def reads_offset(x):
        return x + B.mod.OFFSET

    factor, offset = _changes(tmp_path, twice, lambda: [fingerprint(by_default), fingerprint((reads_factor, reads_offset))])
    assert factor == [True, True]
    assert offset == [False, True]
