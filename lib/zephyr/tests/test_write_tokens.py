"""Dataset.write_tokens (issue 28): the shard layout, skip_existing resume, refused records."""

from __future__ import annotations

import re

import numpy as np
import pytest

from zephyr import Dataset, create_backend
from zephyr.io.tokens import offsets_path, read_npy_header, write_token_ledger

SHARDS = [[[1, 2, 3], [], [65535]], [[7] * 10], []]


def _pipeline(root, seen: list):
    def note(docs):
        seen.append(len(docs))
        return [{"input_ids": d} for d in docs]

    return Dataset.from_list(SHARDS).flat_map(note).write_tokens(f"{root}/part-{{shard:05d}}.npy", dtype="uint16",
                                                                 skip_existing=True)


def test_write_tokens_layout_and_resume(tmp_path):
    """Each shard's .npy holds its documents back to back and its offsets file their starts;
    a rerun after one token file is lost rewrites only that shard."""
    seen: list = []
    paths = list(create_backend("sync").execute(_pipeline(tmp_path, seen)))
    assert sorted(seen) == [0, 1, 3]
    for path, docs in zip(paths, SHARDS):
        assert np.load(path).tolist() == [t for d in docs for t in d]
        assert np.load(offsets_path(path)).tolist() == [0, *np.cumsum([len(d) for d in docs]).tolist()]
        assert read_npy_header(path)[0] == np.dtype("<u2")
    ledger = write_token_ledger(paths, f"{tmp_path}/ledger.json")
    assert [(s["tokens"], s["documents"]) for s in ledger["shards"]] == [(sum(map(len, d)), len(d)) for d in SHARDS]
    (tmp_path / "part-00001.npy").unlink()
    seen.clear()
    assert list(create_backend("sync").execute(_pipeline(tmp_path, seen))) == paths
    assert seen == [1]
    assert np.load(paths[1]).tolist() == [7] * 10


@pytest.mark.parametrize("ids, shown", [([1.7], "1.7 (float)"), ([2.0], "2.0 (float)"), (["1"], "'1' (str)"),
                                        ([True, False], "True (bool)"), (np.array([5.5]), "5.5 (float)")])
def test_write_tokens_refuses_ids_that_are_not_integers(tmp_path, ids, shown):
    """Regression: ids went through np.asarray(..., dtype=int64), so 1.7 was written as token 1,
    "1" as 1 and True as 1, silently; writers never change data. Now the shard fails naming the
    path, record, field and value, and writes nothing."""
    from zephyr import ShardError

    ds = Dataset.from_iterable([{"input_ids": [3]}, {"input_ids": ids}]).write_tokens(f"{tmp_path}/part-{{shard}}.npy")
    expected = f"part-0.npy: record 1: field 'input_ids' is not a list of integers: {shown}"
    with pytest.raises(ShardError, match=re.escape(expected)):
        list(create_backend("sync", progress=False).execute(ds))
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_write_tokens_refuses_a_bad_dtype_at_build_time():
    with pytest.raises(ValueError, match="dtype must be one of"):
        Dataset.from_list([[1]]).write_tokens("x/part-{shard}.npy", dtype="int8")


def test_write_tokens_run_record_and_cleanup_cover_the_offsets_files(tmp_path):
    """The run record lists both files of each token shard, so `zephyr verify` passes on a
    fresh run and after a skip_existing rerun, and catches a lost or cut offsets file; a dead
    writer's temporaries of either file are removed (the offsets file's were left, and verify
    failed on every run with "extra: part-0.offsets.npy")."""
    import os

    from zephyr.io.temporaries import HOST_ID
    from zephyr.status.outputs import verify_directory

    dead = f"999999@{HOST_ID}"  # a pid that is not running: a killed attempt's litter
    planted = [tmp_path / f".part-00000{ext}.zephyr-tmp-{dead}-abcdef123456" for ext in (".npy", ".offsets.npy")]
    for litter in planted:
        litter.write_bytes(b"partial")
    paths = list(create_backend("sync").execute(_pipeline(tmp_path, [])))
    assert not any(p.exists() for p in planted)
    expected = sorted(os.path.basename(f) for p in paths for f in (p, offsets_path(p)))
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".")) == expected
    assert verify_directory(str(tmp_path)).ok, verify_directory(str(tmp_path)).describe()
    list(create_backend("sync").execute(_pipeline(tmp_path, [])))  # every shard kept
    assert verify_directory(str(tmp_path)).ok, verify_directory(str(tmp_path)).describe()
    with open(offsets_path(paths[0]), "r+b") as f:
        f.truncate(os.path.getsize(offsets_path(paths[0])) - 8)
    verdict = verify_directory(str(tmp_path))
    assert [item["path"] for item in verdict.truncated] == [os.path.basename(offsets_path(paths[0]))]
