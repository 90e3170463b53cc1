"""Plan fingerprints: what a resumed run may reuse. Same code -> same digest in any process;
any change to what a stage computes -> a different digest."""

import os
import subprocess
import sys
import textwrap

from zephyr import Dataset
from zephyr.fingerprint import fingerprint
from zephyr.shuffle import key_bytes, partition_of

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
    from zephyr.shuffle import key_bytes, partition_of
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
    assert key_bytes({"b", "a"}) == key_bytes({"a", "b"}) == key_bytes(frozenset(["b", "a"]))
    assert key_bytes(("x", {3, 1, 2})) == key_bytes(("x", {2, 3, 1}))
    assert partition_of(key_bytes({"a", "b"}), 7) == partition_of(key_bytes({"b", "a"}), 7)
