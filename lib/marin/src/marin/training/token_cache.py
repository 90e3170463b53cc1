"""Batches from a Zephyr token cache, each host reading only the byte ranges of its own rows.

A cache is what ``Dataset.write_tokens`` plus ``zephyr.io.tokens.write_token_ledger`` write:
flat ``.npy`` token shards and a ``ledger.json`` with each shard's token count, dtype and
data offset. The global token stream is the shards' tokens in ledger order (documents back
to back, each ending with the end-of-document token the tokenizer put there); it is the
same stream :class:`marin.training.data.TokenBatches` cuts from JSON shards, so the same data
gives the same batches either way.

:class:`TokenCache` maps a global position to ``(shard, offset)`` by a binary search over the
ledger's cumulative counts (no scan) and reads ``[start, stop)`` with one ranged
``cat_file`` per shard touched. :class:`CacheBatches` cuts the stream into
``[batch_size, seq_len]`` batches (wrapping into the next epoch) and reads only ``rows``,
so on H hosts each reads about 1/H of the bytes. Its :class:`~marin.training.data.DataPosition`
is ``(epoch, shard, 0, offset in shard)``, saved with checkpoints like the JSON reader's.

:class:`MixtureBatches` draws each row of ``seq_len`` tokens from one of several caches by
weight: smooth weighted round robin over the global row sequence (row ``r`` goes to the
source furthest behind its share ``weight * (r + 1)``; ties to the first), so it needs no
seed, keeps every prefix within one row of the weights, and its position is just the rows
each source has given (:class:`~marin.training.data.MixturePosition`): a resumed reader continues
every source at its exact token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from zephyr.io import exists
from zephyr.io.files import url_to_fs

from marin.training.data import DataPosition, MixturePosition, batch_rows

__all__ = ["CacheBatches", "MixtureBatches", "TokenCache", "is_token_cache", "ledger_path", "read_ledger"]

LEDGER_NAME = "ledger.json"


def _is_ledger(source: str) -> bool:
    """By its name: a JSON Lines token shard may end in ".json" too."""
    return source.rstrip("/").rsplit("/", 1)[-1] == LEDGER_NAME


def ledger_path(source: str) -> str:
    """The ledger of the cache at ``source`` (the cache folder or its ``ledger.json``)."""
    return source if _is_ledger(source) else f"{source.rstrip('/')}/{LEDGER_NAME}"


def is_token_cache(source: str | Sequence[str]) -> bool:
    """Whether ``source`` names one token cache (a folder holding ``ledger.json``, or the ledger).

    Taken literally first: a cache folder may have ``[``, ``*`` or ``?`` in its name."""
    if not isinstance(source, str):
        return False
    if exists(ledger_path(source)):
        return True
    return _is_ledger(source) and not any(c in source for c in "*?[")


def read_ledger(source: str) -> dict:
    """The ledger of the cache at ``source`` (see ``ledger_path``)."""
    fs, path = url_to_fs(ledger_path(source))
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no token cache ledger at {ledger_path(source)}") from e


_INT32_MAX = 2**31 - 1


class TokenCache:
    """Random access to a token cache's global token stream; counts the bytes it reads."""

    def __init__(self, source: str):
        self.ledger_path = ledger_path(source)
        self.ledger = read_ledger(source)
        base = self.ledger_path.rsplit("/", 1)[0] if "/" in self.ledger_path else "."  # "ledger.json": here
        shards = self.ledger["shards"]
        self.paths = [s["path"] if "://" in s["path"] or s["path"].startswith("/") else f"{base}/{s['path']}"
                      for s in shards]
        self.dtypes = [np.dtype(s["dtype"]).newbyteorder("<") for s in shards]
        self.data_offsets = [int(s["data_offset"]) for s in shards]
        counts = np.array([int(s["tokens"]) for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # shard i holds [starts[i], starts[i+1])
        self.total = int(self.starts[-1])
        self.bytes_read = 0
        self._fs = [url_to_fs(p) for p in self.paths]

    def locate(self, position: int) -> tuple[int, int]:
        """``(shard, offset)`` of global token ``position`` (``0 <= position < total``), skipping empty shards."""
        if not 0 <= position < self.total:
            raise IndexError(f"{self.ledger_path}: token {position} is outside [0, {self.total})")
        shard = int(np.searchsorted(self.starts, position, side="right")) - 1
        return shard, position - int(self.starts[shard])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream as int32 (one ranged read per shard touched)."""
        out = np.empty(stop - start, dtype=np.int32)
        filled, position = 0, start
        while position < stop:
            shard, offset = self.locate(position)
            take = min(stop - position, int(self.starts[shard + 1]) - position)
            itemsize = self.dtypes[shard].itemsize
            lo = self.data_offsets[shard] + offset * itemsize
            fs, path = self._fs[shard]
            data = fs.cat_file(path, start=lo, end=lo + take * itemsize)
            if len(data) != take * itemsize:
                raise ValueError(f"{self.paths[shard]}: short read at token {offset} (cache shard truncated?)")
            self.bytes_read += len(data)
            tokens = np.frombuffer(data, dtype=self.dtypes[shard])
            if tokens.dtype.itemsize == 4 and tokens.dtype.kind == "u" and take and int(tokens.max()) > _INT32_MAX:
                raise ValueError(f"{self.paths[shard]}: token id {int(tokens.max())} at or after token {offset} is outside "
                                 f"[0, {_INT32_MAX}], which the trainer's int32 batches hold")
            out[filled : filled + take] = tokens
            filled, position = filled + take, position + take
        return out

    def read_cyclic(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from ``start`` of the stream repeated forever (epochs back to back)."""
        pieces, start = [], start % self.total
        while count > 0:
            take = min(count, self.total - start)
            pieces.append(self.read(start, start + take))
            count, start = count - take, 0
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int32)


class CacheBatches:
    """``TokenBatches`` over a token cache: same arguments, same batches, same positions' meaning."""

    def __init__(
        self,
        source: str,
        *,
        batch_size: int,
        seq_len: int,
        position: DataPosition | None = None,
        rows: Sequence[tuple[int, int]] | None = None,
    ):
        self.rows = batch_rows(rows, batch_size, seq_len)
        self.cache = TokenCache(source)
        if self.cache.total == 0:
            raise ValueError(f"token cache {self.cache.ledger_path} holds no tokens")
        self.batch_size, self.seq_len = batch_size, seq_len
        position = position or DataPosition()
        if position.shard >= len(self.cache.paths) or position.record != 0:
            raise ValueError(f"data position {position} does not name a token of cache {self.cache.ledger_path}")
        self._epoch = position.epoch
        self._next = int(self.cache.starts[position.shard]) + position.token
        self._normalize()

    @property
    def position(self) -> DataPosition:
        shard, offset = self.cache.locate(self._next)
        return DataPosition(self._epoch, shard, 0, offset)

    def __iter__(self) -> CacheBatches:
        return self

    def __next__(self) -> np.ndarray:
        length = self.seq_len
        parts = [self.cache.read_cyclic(self._next + a * length, (b - a) * length) for a, b in self.rows]
        self._next += self.batch_size * length
        self._normalize()
        return np.concatenate(parts).reshape(-1, length)

    def _normalize(self) -> None:
        self._epoch += self._next // self.cache.total
        self._next %= self.cache.total


class MixtureBatches:
    """Batches whose rows come from several token caches in proportion to ``weights``."""

    def __init__(
        self,
        sources: Sequence[tuple[str, float]],
        *,
        batch_size: int,
        seq_len: int,
        position: MixturePosition | None = None,
        rows: Sequence[tuple[int, int]] | None = None,
    ):
        if not sources or any(not weight > 0 for _, weight in sources):
            raise ValueError(f"a mixture needs at least one source, each with a positive weight, got {sources}")
        self.caches = [TokenCache(path) for path, _ in sources]
        empty = [c.ledger_path for c in self.caches if c.total == 0]
        if empty:
            raise ValueError(f"mixture sources hold no tokens: {empty}")
        total = sum(weight for _, weight in sources)
        self.weights = [weight / total for _, weight in sources]
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rows = batch_rows(rows, batch_size, seq_len)
        self.position = position or MixturePosition((0,) * len(sources))
        if len(self.position.rows) != len(sources):
            raise ValueError(f"mixture position {self.position} is for {len(self.position.rows)} sources, not {len(sources)}")

    def __iter__(self) -> MixtureBatches:
        return self

    def __next__(self) -> np.ndarray:
        taken = list(self.position.rows)
        assigned = []  # (source, its row number) of each row of the batch
        for _ in range(self.batch_size):
            done = sum(taken) + 1
            source = max(range(len(taken)), key=lambda i: (self.weights[i] * done - taken[i], -i))
            assigned.append((source, taken[source]))
            taken[source] += 1
        length = self.seq_len
        out = [self.caches[s].read_cyclic(n * length, length) for a, b in self.rows for s, n in assigned[a:b]]
        self.position = MixturePosition(tuple(taken))
        return np.stack(out)
