"""Deterministic, resumable batches of packed token sequences from Zephyr output shards.

A Zephyr tokenize step writes shards of records such as ``{"input_ids": [17, 4, ...]}`` as
JSON Lines or Parquet; a shard's format comes from its name exactly as Zephyr's readers take
it (``zephyr.readers.format_for``: ``.jsonl``/``.ndjson``/``.json``, ``.parquet``, ``.vortex``, under any of
``.gz``/``.gzip``/``.zst``/``.zstd``). :class:`TokenBatches` reads the
shards in sorted path order, concatenates the token lists of all records, and cuts the
stream into ``batch_size`` rows of ``seq_len`` tokens (document boundaries are not marked;
put an end-of-document token in the data if the model needs one). When the shards run out
it starts over (the next epoch). The order depends only on the files, so two runs see the
same batches.

The reader's :class:`DataPosition` names the next unread token (epoch, shard, record, token
within record). It is saved with every checkpoint; a reader started at that position
continues exactly where the saved run was, reading only the current shard from its start.
Memory: one batch plus one record.

On a multi-host run each host asks for its own ``rows`` of every global batch (the rows its
devices hold). All hosts walk the same token stream, so the position after each batch is
the same on every host and one saved position resumes them all; a host copies only its
rows, but still parses the records in between to find where its rows start (records have
variable lengths). Together the hosts' rows are exactly the batches a one-host run reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from zephyr.io.tokens import token_array
from zephyr.io import expand_glob, read_jsonl, read_parquet
from zephyr.io.vortex import read_vortex
from zephyr.readers import FileFormat, format_for

__all__ = ["DataPosition", "MixturePosition", "TokenBatches", "position_from_dict", "read_records", "resolve_shards"]

@dataclass(frozen=True)
class DataPosition:
    """The next unread token: ``record``'s token ``token`` in shard ``shard``, in ``epoch``."""

    epoch: int = 0
    shard: int = 0
    record: int = 0
    token: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DataPosition:
        return cls(**{k: int(data[k]) for k in ("epoch", "shard", "record", "token")})


@dataclass(frozen=True)
class MixturePosition:
    """Where a mixture of token caches is: how many ``seq_len`` rows each source has given."""

    rows: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"rows": list(self.rows)}

    @classmethod
    def from_dict(cls, data: dict) -> MixturePosition:
        return cls(tuple(int(n) for n in data["rows"]))


def position_from_dict(data: dict) -> DataPosition | MixturePosition:
    """The saved position of either reader (``to_dict`` of it)."""
    return MixturePosition.from_dict(data) if "rows" in data else DataPosition.from_dict(data)


def resolve_shards(source: str | Sequence[str]) -> list[str]:
    """Expand a glob or a list of paths/globs into a sorted, de-duplicated list of shard paths.

    Raises:
        FileNotFoundError: if nothing matches.
        ValueError: if a path is not JSONL, Parquet or Vortex by its extension.
    """
    patterns = [source] if isinstance(source, str) else list(source)
    if not patterns:
        raise ValueError("data source is empty: give a glob such as 'gs://b/tokens/*.jsonl.zst' or a list of paths")
    paths = sorted({path for pattern in patterns for path in expand_glob(pattern)})
    if not paths:
        raise FileNotFoundError(f"no shards match {source!r}")
    for path in paths:
        format_for(path)
    return paths


def read_records(path: str, field: str) -> Iterator[list[int]]:
    """Yield the token list in ``field`` of each record of one shard (via ``zephyr.io``)."""
    fmt = format_for(path)
    readers = {FileFormat.PARQUET: read_parquet, FileFormat.VORTEX: read_vortex}
    records = readers[fmt](path, columns=[field]) if fmt in readers else read_jsonl(path)
    for index, record in enumerate(records):
        if not isinstance(record, dict) or field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{path}: record {index} has no token field {field!r} (has {keys})")
        yield record[field]


class TokenBatches:
    """Iterate ``[batch_size, seq_len]`` int32 batches forever, starting at ``position``.

    ``position`` after each ``next()`` names the first token of the following batch.
    With ``rows`` (sorted ``[start, stop)`` ranges of batch rows) each batch holds only
    those rows, in order: ``[sum of range lengths, seq_len]``.

    >>> batches = TokenBatches(["tokens-0.jsonl"], batch_size=2, seq_len=4)  # doctest: +SKIP
    >>> first = next(batches); saved = batches.position
    >>> again = TokenBatches(["tokens-0.jsonl"], batch_size=2, seq_len=4, position=saved)
    """

    def __init__(
        self,
        shards: Sequence[str],
        *,
        batch_size: int,
        seq_len: int,
        field: str = "input_ids",
        position: DataPosition | None = None,
        rows: Sequence[tuple[int, int]] | None = None,
    ):
        self.rows = batch_rows(rows, batch_size, seq_len)
        if not shards:
            raise ValueError("TokenBatches needs at least one shard")
        self.shards = list(shards)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.field = field
        self.position = position or DataPosition()
        if self.position.shard >= len(self.shards):
            raise ValueError(f"data position {self.position} is past the last of {len(self.shards)} shards")
        self._chunks = self._token_chunks(self.position)
        self._pending: tuple[DataPosition, np.ndarray] | None = None

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> np.ndarray:
        length = self.seq_len
        wanted = [(start * length, stop * length) for start, stop in self.rows]  # token offsets in the batch
        out = np.empty(sum(b - a for a, b in wanted), dtype=np.int32)
        need, cursor, filled = self.batch_size * length, 0, 0
        while cursor < need:
            if self._pending is not None:
                (chunk_position, tokens), self._pending = self._pending, None
            else:
                chunk_position, tokens = next(self._chunks)
            take = min(need - cursor, len(tokens))
            for a, b in wanted:  # copy the parts of [cursor, cursor + take) that are our rows
                lo, hi = max(a, cursor), min(b, cursor + take)
                if lo < hi:
                    out[filled : filled + hi - lo] = tokens[lo - cursor : hi - cursor]
                    filled += hi - lo
            cursor += take
            if take < len(tokens):
                # The next batch starts inside this record.
                self._pending = (_advance(chunk_position, take), tokens[take:])
            self.position = _advance(chunk_position, take)
        return out.reshape(-1, length)

    def _token_chunks(self, start: DataPosition) -> Iterator[tuple[DataPosition, np.ndarray]]:
        epoch, shard, skip_records, skip_tokens = start.epoch, start.shard, start.record, start.token
        while True:
            whole_epoch, produced = (shard, skip_records, skip_tokens) == (0, 0, 0), False
            for shard_index in range(shard, len(self.shards)):
                path = self.shards[shard_index]
                for record_index, tokens in enumerate(read_records(path, self.field)):
                    if record_index < skip_records:
                        continue
                    array = _as_tokens(tokens, path, record_index)
                    offset = skip_tokens if record_index == skip_records else 0
                    if offset < len(array):
                        produced = True
                        yield DataPosition(epoch, shard_index, record_index, offset), array[offset:]
                skip_records = skip_tokens = 0
            if whole_epoch and not produced:
                raise ValueError(f"data source has no tokens in field {self.field!r}: {self.shards[:3]}...")
            epoch, shard = epoch + 1, 0


def batch_rows(rows: Sequence[tuple[int, int]] | None, batch_size: int, seq_len: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` row ranges a host reads (all rows when None), checked with the batch shape."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    checked = [(0, batch_size)] if rows is None else [(int(a), int(b)) for a, b in rows]
    if any(not 0 <= a < b <= batch_size for a, b in checked) or checked != sorted(checked):
        raise ValueError(f"rows must be sorted, non-empty [start, stop) ranges within batch_size {batch_size}, got {rows}")
    return checked


def _advance(position: DataPosition, tokens: int) -> DataPosition:
    return DataPosition(position.epoch, position.shard, position.record, position.token + tokens)


def _as_tokens(tokens, path: str, record_index: int) -> np.ndarray:
    info = np.iinfo(np.int32)
    return token_array(tokens, f"{path}: record {record_index}: token field", info.min, info.max).astype(np.int32)
