"""The shuffle's key hash (`zephyr.shuffle.keys`): seeded xxHash64 of the key bytes, the same on
the frame path (a Polars column) and the record path (Python `bytes`), checked against the
reference xxHash implementation (the `xxhash` package, a binding of the C library)."""

import collections

import polars as pl
import pyarrow as pa
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import col
from zephyr.engine.frame import Frame
from zephyr.expr.key import ExprKey
from zephyr.shuffle.columnar import key_column
from zephyr.shuffle.frame_keys import frame_keys
from zephyr.shuffle.keys import PER_KEY_MAX, SEED, hash_key_bytes, key_bytes, key_column_of, partition_of

# XXH64 with seed 0, as published with the algorithm: the oracle below must give them
PUBLISHED = {b"": 0xEF46DB3751D8E999, b"a": 0xD24EC4F1A98C6E5B, b"abc": 0x44BC2CF5AD770999}

KEYS = st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=3000)), max_size=30)


def oracle(kb: bytes) -> int:
    return xxhash.xxh64_intdigest(kb, seed=SEED)


def test_the_oracle_gives_the_published_xxhash64_values():
    assert {kb: xxhash.xxh64_intdigest(kb) for kb in PUBLISHED} == PUBLISHED


@settings(max_examples=100, deadline=None)
@given(keys=KEYS)
def test_record_path_hashes_are_seeded_xxhash64_of_the_bytes(keys):
    """Any bytes (not UTF-8, NUL, empty, long: pickled keys are arbitrary bytes)."""
    keys = keys + [b"", b"\xff\xfe\x00", b"\x80" * 5000]
    assert hash_key_bytes(keys).tolist() == [oracle(k) for k in keys]


@settings(max_examples=20, deadline=None)
@given(keys=KEYS)
def test_a_batch_too_big_to_hash_key_by_key_hashes_as_its_keys_one_by_one(keys):
    """Both ways `hash_key_bytes` takes (a column above PER_KEY_MAX keys, key by key below) give
    the oracle's hashes."""
    big = (keys + [b"", b"\xff\xfe\x00"]) * (PER_KEY_MAX // 2 + 1)
    assert len(big) > PER_KEY_MAX
    assert hash_key_bytes(big).tolist() == [oracle(k) for k in big] == [int(hash_key_bytes([k])[0]) for k in big]


@settings(max_examples=100, deadline=None)
@given(keys=KEYS, cut=st.integers(0, 30))
def test_a_binary_column_from_arrow_hashes_as_its_bytes(keys, cut):
    """The column path over an Arrow array (whole and sliced) gives the record path's hashes and
    keeps the bytes: rows land in the same partitions on both paths."""
    keys = keys + [b"\xc3\x28", b""]
    array = pa.array(keys, pa.large_binary()).slice(min(cut, len(keys) - 1))
    kb, h = key_column_of(pl.from_arrow(array))
    assert kb.type == pa.large_binary() and kb.to_pylist() == array.to_pylist()
    assert h.tolist() == hash_key_bytes(array.to_pylist()).tolist() == [oracle(k) for k in array.to_pylist()]


@settings(max_examples=60, deadline=None)
@given(values=st.one_of(st.lists(st.text(max_size=300), min_size=1, max_size=30),
                        st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=30)))
def test_frame_path_keys_and_hashes_are_the_record_paths(values):
    """A typed column's key bytes and hashes (`frame_keys`) equal those of its values as records
    (`key_column`, and `key_bytes` + `hash_key_bytes` on the pickled path)."""
    frame = Frame(df=pl.DataFrame({"k": values}), n=len(values))
    kb, h = frame_keys(frame, ExprKey(col("k")))
    record_kb, record_h = key_column(values)
    kbs = [key_bytes(v) for v in values]
    assert kb.to_pylist() == record_kb.to_pylist() == kbs
    assert h.tolist() == record_h.tolist() == hash_key_bytes(kbs).tolist() == [oracle(k) for k in kbs]


def test_no_keys_no_hashes():
    assert hash_key_bytes([]).tolist() == []


def test_partitions_stay_spread_over_keys_sampled_by_the_hash_expression():
    """`col(k).hash() % 4 == 0` (xxHash64, seed 0, of the same key bytes) must not pick the keys
    of one shuffle partition: the shuffle's seed differs."""
    sampled = [k for k in map(str, range(8000)) if xxhash.xxh64_intdigest(key_bytes(k)) % 4 == 0]
    per_partition = collections.Counter(partition_of(key_bytes(k), 4) for k in sampled)
    assert len(sampled) > 1500 and sorted(per_partition) == [0, 1, 2, 3]
    assert min(per_partition.values()) > len(sampled) / 8
