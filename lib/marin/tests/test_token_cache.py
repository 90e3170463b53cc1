"""Token cache: Zephyr's write_tokens + ledger, and the marin reader (issue 28).

Oracles are plain Python: the global stream is the documents concatenated in shard order;
batches are that stream cut into rows, wrapping around.
"""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from fsspec.implementations.local import LocalFileSystem

from marin.training.data import DataPosition, TokenBatches
from marin.training.token_cache import CacheBatches, MixtureBatches, TokenCache, is_token_cache
from zephyr import Dataset, create_backend
from zephyr.io.tokens import offsets_path, write_token_ledger, write_tokens_file


def _docs(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 60000, size=n)] for n in lengths]


def _write_cache(root: str, shards: list[list[list[int]]], dtype: str = "uint32") -> list[str]:
    """Write through the Zephyr pipeline (one shard per inner list) and the ledger."""
    dataset = Dataset.from_list(shards).flat_map(lambda docs: [{"input_ids": d} for d in docs])
    paths = list(create_backend("sync").execute(
        dataset.write_tokens(f"{root}/part-{{shard:05d}}.npy", dtype=dtype, skip_existing=True)))
    write_token_ledger(paths, f"{root}/ledger.json")
    return paths


def _oracle_batches(stream: list[int], batch: int, seq: int, count: int, rows=None) -> list[list[list[int]]]:
    rows = rows or [(0, batch)]
    out, cursor = [], 0
    for _ in range(count):
        window = [stream[(cursor + i) % len(stream)] for i in range(batch * seq)]
        out.append([window[r * seq : (r + 1) * seq] for a, b in rows for r in range(a, b)])
        cursor += batch * seq
    return out


split = st.lists(st.lists(st.integers(0, 40), max_size=6), min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(split)
def test_cache_stream_equals_concatenated_documents(tmp_path_factory, lengths):
    """Round trip: the ledger's counts, each shard's offsets, the global stream, and the
    position map all match the documents written (hypothesis over lengths and shard splits)."""
    root = str(tmp_path_factory.mktemp("cache"))
    shards = [_docs(ls, seed=i) for i, ls in enumerate(lengths)]
    paths = _write_cache(root, shards)
    stream = [t for docs in shards for d in docs for t in d]
    ledger = json.loads(open(f"{root}/ledger.json").read())
    assert [s["tokens"] for s in ledger["shards"]] == [sum(map(len, docs)) for docs in shards]
    assert [s["documents"] for s in ledger["shards"]] == [len(docs) for docs in shards]
    for path, docs in zip(paths, shards):
        tokens, offsets = np.load(path), np.load(offsets_path(path))  # plain NumPy reads the layout
        assert [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == docs
    cache = TokenCache(root)
    assert cache.read(0, cache.total).tolist() == stream
    owner = [(s, o) for s, docs in enumerate(shards) for o in range(sum(map(len, docs)))]  # linear oracle
    for position in range(len(stream)):
        assert cache.locate(position) == owner[position]
    if stream:
        batches = CacheBatches(root, batch_size=3, seq_len=5)
        got = [next(batches).tolist() for _ in range(3)]
        assert got == _oracle_batches(stream, 3, 5, 3)


def test_cache_batches_match_json_shards_and_resume(tmp_path):
    """Same documents as JSON shards and as a cache: the same batches; a reader started at a
    saved position continues with the same batches as one that never stopped."""
    shards = [_docs([7, 0, 13], 1), _docs([5, 21], 2), _docs([], 3), _docs([9], 4)]
    _write_cache(str(tmp_path / "cache"), shards)
    json_paths = list(create_backend("sync").execute(
        Dataset.from_list(shards).flat_map(lambda docs: [{"input_ids": d} for d in docs])
        .write_jsonl(str(tmp_path / "json" / "part-{shard:05d}.jsonl"))))
    from_json = TokenBatches(sorted(json_paths), batch_size=2, seq_len=6)
    from_cache = CacheBatches(str(tmp_path / "cache"), batch_size=2, seq_len=6)
    expected = [next(from_json).tolist() for _ in range(12)]  # > 2 epochs of 55 tokens
    got = []
    for i in range(12):
        got.append(next(from_cache).tolist())
        if i == 4:
            from_cache = CacheBatches(str(tmp_path / "cache"), batch_size=2, seq_len=6, position=from_cache.position)
    assert got == expected
    assert from_cache.position.epoch == 12 * 12 // 55


class CountingFileSystem(LocalFileSystem):
    """Local files under ``counting://``, counting the bytes every opened file's reads return
    (``cat_file`` reads through ``_open`` too): what a host fetched, apart from the reader's
    own count."""

    protocol = ("counting",)
    bytes_read = 0

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("counting://"))

    def _open(self, path, mode="rb", **kwargs):
        handle = super()._open(path, mode, **kwargs)
        read = handle.read

        def counted(*args):
            data = read(*args)
            CountingFileSystem.bytes_read += len(data)
            return data

        handle.read = counted
        return handle


fsspec.register_implementation("counting", CountingFileSystem, clobber=True)


@pytest.mark.parametrize("hosts", [1, 4, 16])
def test_each_host_reads_its_share_of_bytes(tmp_path, hosts):
    """H hosts, each with 1/H of the rows: each reads <= 1.1/H of the batches' token bytes plus
    one document (counted by a filesystem wrapper under every read, the ledger included), and
    together they form the one-host batches."""
    lengths = [int(n) for n in np.random.default_rng(5).integers(1, 200, size=400)]
    docs = _docs(lengths)
    _write_cache(str(tmp_path), [docs[i::4] for i in range(4)], dtype="uint16")
    batch, seq, steps = 32, 64, 20
    whole = CacheBatches(str(tmp_path), batch_size=batch, seq_len=seq)
    expected = np.concatenate([next(whole) for _ in range(steps)])
    all_bytes = whole.cache.bytes_read
    assert all_bytes == batch * seq * steps * 2
    per_host = batch // hosts
    parts = []
    for h in range(hosts):
        CountingFileSystem.bytes_read = 0
        reader = CacheBatches(f"counting://{tmp_path}", batch_size=batch, seq_len=seq,
                              rows=[(h * per_host, (h + 1) * per_host)])
        ledger_bytes = CountingFileSystem.bytes_read
        assert ledger_bytes == os.path.getsize(tmp_path / "ledger.json")
        parts.append(np.stack([next(reader) for _ in range(steps)]))
        assert CountingFileSystem.bytes_read - ledger_bytes <= 1.1 * all_bytes / hosts + max(lengths) * 2
    assert np.array_equal(np.concatenate(parts, axis=1).reshape(-1, seq), expected)


def test_cache_on_gcs(gcs_bucket):
    """The pipeline writes the cache to gs:// and the reader's ranged reads work there."""
    shards = [_docs([10, 3], 1), _docs([8], 2)]
    root = f"{gcs_bucket}/cache"
    _write_cache(root, shards, dtype="uint16")
    assert is_token_cache(root)
    stream = [t for docs in shards for d in docs for t in d]
    assert TokenCache(root).read(2, 19).tolist() == stream[2:19]


def test_token_id_too_large_names_path_record_and_field(tmp_path):
    """An id that the dtype cannot hold fails the shard naming it; nothing is written."""
    path = str(tmp_path / "part-00000.npy")
    with pytest.raises(ValueError, match=r"part-00000.npy: record 1: field 'input_ids' has token ids outside"):
        write_tokens_file([{"input_ids": [1]}, {"input_ids": [70000]}], path, dtype="uint16")
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"record 0 has no token list in field 'ids'"):
        write_tokens_file([{"input_ids": [1]}], path, field="ids")


def test_resume_position_names_a_cache_token(tmp_path):
    _write_cache(str(tmp_path), [_docs([4, 4])])
    with pytest.raises(ValueError, match="does not name a token"):
        CacheBatches(str(tmp_path), batch_size=1, seq_len=2, position=DataPosition(0, 0, 3, 0))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(1, 4), st.integers(0, 6))
def test_mixture_rows_follow_weights_and_resume_exactly(tmp_path_factory, weights, batch, stop):
    """Sources with disjoint id ranges: each source's rows, in order, are its own stream cut in
    seq_len rows (wrapping); every prefix of rows is within one row of the weights; a reader
    resumed at a saved position continues identically; hosts' rows together are the batch."""
    seq, steps = 3, 8
    roots, streams = [], []
    for i, _ in enumerate(weights):
        root = str(tmp_path_factory.mktemp(f"src{i}"))
        docs = [[1000 * i + t for t in range(n)] for n in (5, 2, 7)]
        _write_cache(root, [docs[:2], docs[2:]])
        roots.append(root)
        streams.append([t for d in docs for t in d])
    sources = list(zip(roots, weights))
    reader = MixtureBatches(sources, batch_size=batch, seq_len=seq)
    got = []
    for step in range(steps):
        if step == stop:
            reader = MixtureBatches(sources, batch_size=batch, seq_len=seq, position=reader.position)
        got.extend(next(reader).tolist())
    given_rows = [0] * len(weights)
    for n, row in enumerate(got, start=1):
        source = row[0] // 1000
        k = given_rows[source]
        assert row == [streams[source][(k * seq + j) % len(streams[source])] for j in range(seq)]
        given_rows[source] += 1
        for i, w in enumerate(weights):
            assert abs(given_rows[i] - n * w / sum(weights)) < 1 + 1e-9
    assert list(reader.position.rows) == given_rows
    if batch > 1:
        halves = [MixtureBatches(sources, batch_size=batch, seq_len=seq, rows=r) for r in ([(0, 1)], [(1, batch)])]
        assert [np.concatenate([next(h) for h in halves]).tolist() for _ in range(steps)] == \
            [got[k * batch : (k + 1) * batch] for k in range(steps)]


def test_train_loop_on_a_mixture_resumes_to_the_same_params(tmp_path):
    """train_loop with {cache: weight}: the MixturePosition goes into the checkpoint and a
    resumed run (6 steps, then on to 10) ends with the parameters of a run of 10 in one go."""
    import jax

    from marin.training import tiny_lm
    from marin.training.checkpoint import load_checkpoint
    from marin.training.data import MixturePosition
    from marin.training.train import train_loop

    texts = [f"{i}: all happy families are alike" for i in range(10)]
    sources = {}
    for name, weight in (("a", 3), ("b", 1)):
        root = str(tmp_path / name)
        _write_cache(root, [[list(f"{name}{t}\n".encode()) for t in texts[:5]], [list(t.encode()) for t in texts[5:]]])
        sources[root] = weight

    def run(directory, steps):
        return train_loop(tiny_lm.train_step, tiny_lm.init_state, sources, batch_size=8, seq_len=8, num_steps=steps,
                          checkpoint_path=str(tmp_path / directory), checkpoint_every=3)

    run("split", 6)
    resumed = run("split", 10)
    assert resumed.resumed_from == 6
    run("whole", 10)
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(0))
    got, want = load_checkpoint(str(tmp_path / "split"), template), load_checkpoint(str(tmp_path / "whole"), template)
    assert got.data_position == want.data_position == MixturePosition((60, 20))  # 80 rows, weights 3:1
    for a, b in zip(jax.tree_util.tree_leaves(got.state["params"]), jax.tree_util.tree_leaves(want.state["params"])):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_one_token_check_for_the_cache_writer_and_the_json_reader(tmp_path):
    """The cache writer and the JSON/Parquet token reader share zephyr.io.tokens.token_array:
    a bad token list names the file, record and field in both, and the bounds are each one's."""
    from marin.training.data import _as_tokens
    from zephyr.io.tokens import token_array

    assert token_array([1, 2, 3], "f: record 0", 0, 3).tolist() == [1, 2, 3]
    for bad, why in (([1, "x"], "is not a list of integers"), ([[1], [2]], "must be a flat list"), ([4], r"has token ids outside \[0, 3\]")):
        with pytest.raises(ValueError, match=rf"^f: record 0 {why}"):
            token_array(bad, "f: record 0", 0, 3)
    assert _as_tokens([2**31 - 1], "p.jsonl", 5).dtype == np.int32
    with pytest.raises(ValueError, match=r"^p.jsonl: record 5: token field has token ids outside"):
        _as_tokens([2**31], "p.jsonl", 5)


def test_resuming_on_another_cache_or_a_swapped_mixture_is_refused(tmp_path):
    """Regression: the resume guard hashed only the sources' basenames, always `ledger.json`, so
    a checkpoint made on one cache resumed on another (or on a mixture with its sources
    swapped), its position pointing into other data. The ledgers' listings count now."""
    from marin.training import tiny_lm
    from marin.training.train import train_loop

    text = [list(f"{i}: all happy families are alike\n".encode()) for i in range(6)]
    _write_cache(str(tmp_path / "a"), [text[:3], text[3:]])
    _write_cache(str(tmp_path / "b"), [text[1:], text[:1]])

    def run(data, directory, steps=3):
        return train_loop(tiny_lm.train_step, tiny_lm.init_state, data, batch_size=8, seq_len=8, num_steps=steps,
                          checkpoint_path=str(tmp_path / directory), checkpoint_every=3)

    run(str(tmp_path / "a"), "one")
    with pytest.raises(ValueError, match=r"other data than this run's \(ledgers_sha256"):
        run(str(tmp_path / "b"), "one", steps=4)
    mixture = {str(tmp_path / "a"): 0.5, str(tmp_path / "b"): 0.5}
    run(mixture, "mix")
    with pytest.raises(ValueError, match=r"other data than this run's \(ledgers_sha256"):
        run(dict(reversed(list(mixture.items()))), "mix", steps=4)
    assert run(str(tmp_path / "a"), "one", steps=4).resumed_from == 3  # the same cache resumes


def test_a_json_lines_shard_named_json_is_not_taken_for_a_ledger(tmp_path):
    """Regression: any path ending in ".json" counted as a cache's ledger, so a JSON Lines token
    shard `tokens-00000.json` (a documented extension) failed to parse as one."""
    from marin.training.token_cache import ledger_path
    from marin.training.train import _resolve_data

    shard = tmp_path / "tokens-00000.json"
    shard.write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n" + json.dumps({"input_ids": [5, 6]}) + "\n")
    assert not is_token_cache(str(shard)) and ledger_path(str(shard)) == f"{shard}/ledger.json"
    assert _resolve_data(str(shard)).cache is None and _resolve_data(str(shard)).shards == [str(shard)]
    assert ledger_path(str(tmp_path / "c" / "ledger.json")) == str(tmp_path / "c" / "ledger.json")


def test_a_cache_folder_named_with_brackets_is_read_as_a_cache(tmp_path):
    """Regression: any source with `[`, `*` or `?` counted as a glob of JSON/Parquet shards, so a
    cache the tokenize step wrote to `cache[1]` was "no shards match" by its folder and, by its
    ledger, read as a JSON Lines shard (malformed JSON). The oracle is NumPy's load of the shards."""
    from marin.training.train import _resolve_data

    root = tmp_path / "cache[1]"
    paths = _write_cache(str(root), [_docs([5, 3]), _docs([4], seed=1)])
    stream = np.concatenate([np.load(p) for p in paths]).tolist()
    for source in (str(root), str(root / "ledger.json")):
        assert is_token_cache(source)
        data = _resolve_data(source)
        assert data.cache == str(root / "ledger.json")
        assert next(data.batches(2, 6, "input_ids", None, None)).tolist() == _oracle_batches(stream, 2, 6, 1)[0]
    assert not is_token_cache(str(tmp_path / "cache[12]"))  # a glob of folders is not one cache


def test_a_cache_named_by_a_bare_ledger_json_reads_its_shards_beside_it(tmp_path, monkeypatch):
    """Regression: the shards' folder was the ledger path up to its last "/", which a bare
    "ledger.json" (the cache in the working directory) lacks, so the reader looked for
    "ledger.json/part-00000.npy". The oracle is NumPy's load of the shards."""
    paths = _write_cache(str(tmp_path), [_docs([5, 3]), _docs([4], seed=1)])
    monkeypatch.chdir(tmp_path)
    stream = np.concatenate([np.load(p) for p in paths]).tolist()
    batches = CacheBatches("ledger.json", batch_size=2, seq_len=6)
    assert [next(batches).tolist() for _ in range(2)] == _oracle_batches(stream, 2, 6, 2)


def test_uint32_token_ids_beyond_int32_are_refused_not_wrapped(tmp_path):
    """Regression: the cache reader cast uint32 ids of 2**31 and above into its int32 batches,
    where they wrapped negative; the JSON reader refuses them. Now both refuse."""
    _write_cache(str(tmp_path), [[[1, 2, 2**31 + 5, 4]]], dtype="uint32")
    cache = TokenCache(str(tmp_path))
    assert cache.read(0, 2).tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"token id 2147483653 .* outside \[0, 2147483647\]"):
        cache.read(0, 4)
