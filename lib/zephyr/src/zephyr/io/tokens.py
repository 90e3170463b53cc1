"""Token cache shards: token ids as a flat NumPy ``.npy`` array plus per-document offsets.

Layout of one shard written to ``path`` (``part-00000.npy``):

- ``path``: a version-1 ``.npy`` file holding every token id of the shard, documents back to
  back, as ``uint16`` or ``uint32`` (little endian);
- ``offsets_path(path)`` (``part-00000.offsets.npy``): ``int64`` document starts, one per
  document plus the total, so document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.

Why ``.npy``: ``numpy.load(path, mmap_mode="r")`` opens it anywhere (Grain's and Levanter's
data sources take NumPy arrays), the data sits at a fixed byte offset after a small header,
so a reader fetches any token range with one ranged read (``fsspec`` ``cat_file``), local
or ``gs://``. The offsets file is written (atomically) before the token file, so a token
file that exists always has its offsets; ``skip_existing`` keys on the token file.

:func:`write_token_ledger` writes ``ledger.json`` for a set of shards: per shard its path,
token and document counts, dtype and data offset, read from the headers (a few hundred
bytes per shard), so a reader maps a global token position to a shard without scanning.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence

import numpy as np

from zephyr.io.files import atomic_write, open_input, url_to_fs

__all__ = ["LEDGER_NAME", "TOKEN_DTYPES", "offsets_path", "read_npy_header", "token_array", "write_token_ledger", "write_tokens_file"]

LEDGER_NAME = "ledger.json"
TOKEN_DTYPES = ("uint16", "uint32")
_COPY_CHUNK = 1 << 22


def token_array(tokens, where: str, low: int, high: int) -> np.ndarray:
    """`tokens` as a flat int64 array of ids within [low, high]; a ValueError starting with
    `where` (file, record, field) otherwise. One check for the cache writer and the readers
    of JSON/Parquet token shards. Ids must be integers: a float, string or bool is refused,
    never truncated or parsed (1.7 would otherwise become token 1)."""
    try:
        raw = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a list of integers: {e}") from e
    if raw.ndim != 1:
        raise ValueError(f"{where} must be a flat list, got shape {raw.shape}")
    if raw.size and raw.dtype.kind not in "iu":
        values = raw.tolist()
        bad = next((v for v in values if not isinstance(v, int) or isinstance(v, bool)), None)
        if bad is not None:
            raise ValueError(f"{where} is not a list of integers: {bad!r} ({type(bad).__name__})")
        raise ValueError(f"{where} has token ids outside [{low}, {high}]")  # Python ints beyond 64 bits
    if raw.size and (int(raw.min()) < low or int(raw.max()) > high):
        raise ValueError(f"{where} has token ids outside [{low}, {high}]")
    return raw.astype(np.int64, copy=False)


def offsets_path(path: str) -> str:
    """The offsets file beside the token file ``path`` (``x.npy`` -> ``x.offsets.npy``)."""
    return (path[:-4] if path.endswith(".npy") else path) + ".offsets.npy"


def write_tokens_file(
    records: Iterable, path: str, *, field: str = "input_ids", dtype: str = "uint32", remove_stale: bool = True,
) -> int:
    """Write the token lists in ``field`` of ``records`` as one cache shard; returns the document count.

    Records are dicts with ``field`` or bare token lists. Raises ValueError naming the path,
    record and field for a record without tokens, with an id that is not an integer, or with
    one that ``dtype`` cannot hold;
    nothing is written then (both files are atomic, the token file last).
    """
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"{path}: write_tokens dtype must be one of {TOKEN_DTYPES}, got {dtype!r}")
    limit = np.iinfo(dtype).max
    starts = [0]
    with tempfile.TemporaryFile() as spool:  # token bytes, so the header can carry the final length
        for index, record in enumerate(records):
            tokens = record.get(field) if isinstance(record, dict) else record
            if tokens is None or isinstance(tokens, (str, bytes)):
                what = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}: record {index} has no token list in field {field!r} (has {what})")
            array = token_array(tokens, f"{path}: record {index}: field {field!r}", 0, limit)
            spool.write(array.astype("<" + np.dtype(dtype).str[1:]).tobytes())
            starts.append(starts[-1] + array.size)
        with atomic_write(offsets_path(path), remove_stale=remove_stale) as out:
            np.save(out, np.asarray(starts, dtype="<i8"))
        spool.seek(0)
        with atomic_write(path, remove_stale=remove_stale) as out:
            header = {"descr": np.dtype(dtype).newbyteorder("<").str, "fortran_order": False, "shape": (starts[-1],)}
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(spool, out, _COPY_CHUNK)
    return len(starts) - 1


def read_npy_header(path: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, byte offset of the data) of the ``.npy`` file at ``path``, reading only its header."""
    with open_input(path) as f:
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            raise ValueError(f"{path}: token shards are .npy version 1.0, got {version}")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        if fortran or len(shape) != 1:
            raise ValueError(f"{path}: a token shard is a flat C-order array, got shape {shape}")
        return dtype, shape, f.tell()


def write_token_ledger(paths: Sequence[str], ledger: str) -> dict:
    """Write the JSON ledger of the token shards ``paths`` (in this order) to ``ledger``; returns it."""
    shards = []
    for path in paths:
        dtype, (tokens,), data_offset = read_npy_header(path)
        _, (starts,), offsets_data = read_npy_header(offsets_path(path))
        shards.append({
            "path": os.path.relpath(path, os.path.dirname(ledger)) if _same_folder(path, ledger) else path,
            "tokens": int(tokens), "documents": int(starts) - 1, "dtype": np.dtype(dtype).name,
            "data_offset": data_offset, "offsets_data_offset": offsets_data,
        })
    content = {"format": "zephyr-token-cache/1", "tokens": sum(s["tokens"] for s in shards),
               "documents": sum(s["documents"] for s in shards), "shards": shards}
    with atomic_write(ledger, "w") as out:
        json.dump(content, out, indent=1)
    return content


def _same_folder(path: str, ledger: str) -> bool:
    return url_to_fs(path)[0] is url_to_fs(ledger)[0] and os.path.dirname(path) == os.path.dirname(ledger)
