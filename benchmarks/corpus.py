"""A deterministic synthetic corpus for benchmarks: N JSONL.zst shards of {"id", "url", "text"}.

Every document is a pure function of (seed, global index), so a shard can be generated in any
process, in any order, and the same arguments always give the same bytes:

- text: pseudo-words drawn from a Zipf-like vocabulary (a few words are very common, most are
  rare, some carry "," or "."), its length uniform in [min_chars, max_chars];
- a `dup_fraction` of documents are exact duplicates: such a document copies the text of
  another, non-duplicate document anywhere in the corpus (usually in another shard), under
  its own id and url. The distinct texts are therefore exactly the non-duplicate documents,
  which is how `CorpusInfo.unique_texts` is known without reading anything back.

    from corpus import ensure_corpus
    info = ensure_corpus("/tmp/corpus", num_shards=16, docs_per_shard=10_000, dup_fraction=0.1)
    info.paths  # sorted shard paths

`ensure_corpus` reuses a directory whose manifest (`corpus.json`) records the same parameters.
Run as a script to generate one: `python benchmarks/corpus.py OUT_DIR --shards 16 --docs-per-shard 10000`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import struct
from dataclasses import asdict, dataclass

import orjson
import zstandard

__all__ = ["CorpusInfo", "CorpusSpec", "document", "ensure_corpus", "read_shard"]

_VOCAB_SIZE = 4096
_TABLE_BITS = 16  # each word is chosen by 16 bits of SHAKE output through a 65,536-slot table
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
_ZSTD_LEVEL = 3
_WRITE_BATCH = 1 << 20


@dataclass(frozen=True)
class CorpusSpec:
    """What a corpus is made of; equal specs give byte-identical shards."""

    num_shards: int
    docs_per_shard: int
    dup_fraction: float = 0.1
    min_chars: int = 200
    max_chars: int = 2000
    seed: int = 0

    def __post_init__(self):
        if self.num_shards <= 0 or self.docs_per_shard <= 0:
            raise ValueError(f"num_shards and docs_per_shard must be positive, got {self.num_shards}, {self.docs_per_shard}")
        if not 0.0 <= self.dup_fraction < 1.0:
            raise ValueError(f"dup_fraction must be in [0, 1), got {self.dup_fraction}")
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError(f"need 1 <= min_chars <= max_chars, got {self.min_chars}, {self.max_chars}")

    @property
    def num_docs(self) -> int:
        return self.num_shards * self.docs_per_shard


@dataclass(frozen=True)
class CorpusInfo:
    spec: CorpusSpec
    directory: str
    paths: tuple[str, ...]
    num_docs: int
    duplicates: int  # documents whose text copies another document's
    unique_texts: int  # = num_docs - duplicates: what an exact dedup must keep
    bytes_uncompressed: int
    bytes_compressed: int


# ---- the document function --------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _word_table(seed: int) -> tuple[str, ...]:
    """65,536 slots mapping a uniform 16-bit value to a word with Zipf(1) frequencies."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < _VOCAB_SIZE:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    weights = [1.0 / (rank + 1) for rank in range(_VOCAB_SIZE)]
    total = sum(weights)
    slots = 1 << _TABLE_BITS
    table: list[str] = []
    cumulative = 0.0
    for rank, weight in enumerate(weights):
        cumulative += weight
        while len(table) < min(slots, round(cumulative / total * slots)):
            table.append(words[rank])
    table.extend(words[-1:] * (slots - len(table)))
    # about 1 word in 14 ends a sentence, 1 in 20 carries a comma
    return tuple(w + "." if i % 14 == 3 else w + "," if i % 20 == 7 else w for i, w in enumerate(table))


def _u64(seed: int, *parts: int) -> int:
    data = struct.pack(f"<{1 + len(parts)}q", seed, *parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _is_duplicate(spec: CorpusSpec, g: int) -> bool:
    return _u64(spec.seed, 1, g) < spec.dup_fraction * 2**64


def _original_of(spec: CorpusSpec, g: int) -> int:
    """The non-duplicate document whose text duplicate `g` copies."""
    for attempt in itertools.count():
        other = _u64(spec.seed, 2, g, attempt) % spec.num_docs
        if other != g and not _is_duplicate(spec, other):
            return other
    raise AssertionError("unreachable")


def _text(spec: CorpusSpec, g: int) -> str:
    table = _word_table(spec.seed)
    max_words = spec.max_chars // 2 + 1
    raw = hashlib.shake_128(struct.pack("<qq", spec.seed, g)).digest(4 + 2 * max_words)
    span = spec.max_chars - spec.min_chars + 1
    target = spec.min_chars + int.from_bytes(raw[:4], "little") % span
    indices = memoryview(raw)[4:].cast("H")
    words: list[str] = []
    length = -1
    for i in indices:
        word = table[i]
        length += len(word) + 1
        words.append(word)
        if length >= target:
            break
    text = " ".join(words)[:target]
    return text[0].upper() + text[1:]


def document(spec: CorpusSpec, g: int) -> dict:
    """Document number `g` (0-based, over the whole corpus)."""
    source = _original_of(spec, g) if _is_duplicate(spec, g) else g
    site = _u64(spec.seed, 3, g) % 5000
    return {"id": f"doc-{g:010d}", "url": f"https://site{site:04d}.example.org/page/{g}", "text": _text(spec, source)}


# ---- writing and reading shards ------------------------------------------------------------------


def shard_path(directory: str, shard: int) -> str:
    return os.path.join(directory, f"corpus-{shard:05d}.jsonl.zst")


def _write_shard(spec: CorpusSpec, directory: str, shard: int) -> tuple[int, int, int]:
    """Write one shard atomically; returns (duplicates, uncompressed bytes, compressed bytes)."""
    path = shard_path(directory, shard)
    tmp = f"{path}.tmp-{os.getpid()}"
    compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compressobj()
    duplicates = raw_bytes = 0
    first = shard * spec.docs_per_shard
    with open(tmp, "wb") as f:
        batch: list[bytes] = []
        size = 0
        for g in range(first, first + spec.docs_per_shard):
            duplicates += _is_duplicate(spec, g)
            line = orjson.dumps(document(spec, g), option=orjson.OPT_APPEND_NEWLINE)
            batch.append(line)
            size += len(line)
            if size >= _WRITE_BATCH:
                f.write(compressor.compress(b"".join(batch)))
                raw_bytes += size
                batch, size = [], 0
        f.write(compressor.compress(b"".join(batch)))
        f.write(compressor.flush())
        raw_bytes += size
    os.replace(tmp, path)
    return duplicates, raw_bytes, os.path.getsize(path)


def _write_shard_star(args: tuple) -> tuple[int, int, int]:
    return _write_shard(*args)


def ensure_corpus(directory: str, processes: int | None = None, **spec_fields) -> CorpusInfo:
    """Generate the corpus into `directory` (or reuse it if its manifest has the same spec).

    Shards are written in parallel by `processes` worker processes (default: all cores).
    """
    spec = CorpusSpec(**spec_fields)
    manifest = os.path.join(directory, "corpus.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            saved = json.load(f)
        paths = tuple(shard_path(directory, s) for s in range(spec.num_shards))
        if saved.get("spec") == asdict(spec) and all(os.path.exists(p) for p in paths):
            return CorpusInfo(spec=spec, directory=directory, paths=paths,
                              **{k: v for k, v in saved.items() if k not in ("spec", "directory", "paths")})
        os.remove(manifest)
    os.makedirs(directory, exist_ok=True)
    jobs = [(spec, directory, s) for s in range(spec.num_shards)]
    processes = min(processes or os.cpu_count() or 1, spec.num_shards)
    if processes > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            results = pool.map(_write_shard_star, jobs, chunksize=1)
    else:
        results = [_write_shard_star(job) for job in jobs]
    duplicates = sum(r[0] for r in results)
    info = CorpusInfo(
        spec=spec,
        directory=directory,
        paths=tuple(shard_path(directory, s) for s in range(spec.num_shards)),
        num_docs=spec.num_docs,
        duplicates=duplicates,
        unique_texts=spec.num_docs - duplicates,
        bytes_uncompressed=sum(r[1] for r in results),
        bytes_compressed=sum(r[2] for r in results),
    )
    saved = {k: v for k, v in asdict(info).items() if k not in ("directory", "paths")}
    tmp = f"{manifest}.tmp"
    with open(tmp, "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(tmp, manifest)
    return info


def read_shard(path: str):
    """Yield the documents of one shard (plain zstandard + orjson; independent of zephyr)."""
    import io

    with open(path, "rb") as raw:
        reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=1 << 20)
        for line in reader:
            yield orjson.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description="Generate the synthetic benchmark corpus.")
    parser.add_argument("out_dir", help="directory for corpus-NNNNN.jsonl.zst and corpus.json")
    parser.add_argument("--shards", type=int, default=16, help="number of shards (default 16)")
    parser.add_argument("--docs-per-shard", type=int, default=5000, help="documents per shard (default 5000)")
    parser.add_argument("--dup-fraction", type=float, default=0.1, help="fraction of exact duplicates (default 0.1)")
    parser.add_argument("--min-chars", type=int, default=200, help="shortest text (default 200)")
    parser.add_argument("--max-chars", type=int, default=2000, help="longest text (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()
    info = ensure_corpus(args.out_dir, num_shards=args.shards, docs_per_shard=args.docs_per_shard,
                         dup_fraction=args.dup_fraction, min_chars=args.min_chars, max_chars=args.max_chars, seed=args.seed)
    print(f"{info.num_docs:,} docs ({info.duplicates:,} duplicates) in {len(info.paths)} shards under {info.directory}: "
          f"{info.bytes_uncompressed / 1e6:,.1f} MB of JSONL, {info.bytes_compressed / 1e6:,.1f} MB compressed")


if __name__ == "__main__":
    main()
