"""The tokenize step: texts -> a Zephyr token cache (``Dataset.write_tokens`` + ``ledger.json``).

``tokenize_dataset`` adds the encoding and the writer to any Zephyr dataset of records with a
text field; ``finish_token_cache`` writes the ledger once every shard is written (it reads
only the shards' headers). ``tokenize_to_cache`` is both as an ``ExecutorStep`` function.
Shards are written atomically and ``skip_existing``: a rerun after a crash redoes only the
shards that are missing. Zephyr keeps an output made by other code from the same input, so the
tokenizer is checked here: ``output_path/.tokenizer.json`` names the one the shards were made
with (its spec, ``eod_token``, a digest of a ``tokenizer.json``'s bytes, and the ``text_field``
it encoded), and a run with another tokenizer or text field removes the old shards first. A run also removes the ledger first, so a run
that stops before ``finish_token_cache`` leaves no ledger over shards it does not describe.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from zephyr import Dataset, counters, create_backend
from zephyr.io.files import atomic_write, url_to_fs
from zephyr.io.tokens import LEDGER_NAME, write_token_ledger

from marin.tokenize.tokenizers import load_tokenizer

__all__ = ["TOKENIZER_NAME", "TokenizeConfig", "finish_token_cache", "tokenize_dataset", "tokenize_to_cache"]

logger = logging.getLogger(__name__)

TOKENIZER_NAME = ".tokenizer.json"  # beside the shards: the tokenizer that made them


def _encode_shard(stream: Iterator, *, spec: str, eod_token: str | None, text_field: str, batch_size: int):
    tokenizer = load_tokenizer(spec, eod_token)
    index = 0
    while batch := list(itertools.islice(stream, batch_size)):
        texts = []
        for record in batch:
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"record {index}: field {text_field!r} must be a string, got {type(text).__name__}")
            texts.append(text)
            index += 1
        encoded = tokenizer.encode_batch(texts)
        counters.increment("tokenize/documents", len(encoded))
        counters.increment("tokenize/tokens", sum(map(len, encoded)))
        yield from encoded


def tokenize_dataset(dataset, output_path: str, *, tokenizer: str = "byte", eod_token: str | None = None,
                     text_field: str = "text", batch_size: int = 256):
    """``dataset`` encoded and written as token cache shards ``output_path/part-NNNNN.npy`` (uint16
    ids when the vocabulary fits, else uint32); run it, then call :func:`finish_token_cache`.

    Prepares ``output_path`` when called: removes its ledger, and its shards if they were made
    with another tokenizer (see the module docstring)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int (documents encoded at a time), got {batch_size!r}")
    vocab = load_tokenizer(tokenizer, eod_token).vocab_size
    _claim(output_path.rstrip("/"), _tokenizer_identity(tokenizer, eod_token, text_field))
    encode = functools.partial(_encode_shard, spec=tokenizer, eod_token=eod_token, text_field=text_field,
                               batch_size=batch_size)
    return dataset.map_shard(encode).write_tokens(
        f"{output_path.rstrip('/')}/part-{{shard:05d}}.npy", dtype="uint16" if vocab <= 1 << 16 else "uint32",
        skip_existing=True,
    )


def _tokenizer_identity(spec: str, eod_token: str | None, text_field: str) -> dict:
    """What decides the shards' tokens: the tokenizer, its end-of-document token, the field encoded."""
    identity = {"tokenizer": spec, "eod_token": eod_token, "text_field": text_field}
    if spec != "byte":
        fs, path = url_to_fs(spec)
        data = fs.cat_file(path)
        identity["sha256"] = hashlib.sha256(data).hexdigest()
        settings = json.loads(data)
        if settings.get("padding") or settings.get("truncation"):
            # encoded whole since these settings are turned off: caches made before (padded or cut
            # documents, same file) lack this key, so their shards are removed and made again
            identity["whole_documents"] = True
    return identity


def _claim(output_path: str, identity: dict) -> None:
    """Remove the ledger; remove the shards too unless our tokenizer (and text field) made them; record ours."""
    fs, root = url_to_fs(output_path)
    if fs.exists(f"{root}/{LEDGER_NAME}"):
        fs.rm_file(f"{root}/{LEDGER_NAME}")
    marker = f"{root}/{TOKENIZER_NAME}"
    before = json.loads(fs.cat_file(marker)) if fs.exists(marker) else None
    if before == identity:
        return
    shards = fs.glob(f"{glob.escape(root)}/part-*.npy")  # the folder taken literally ("out[1]/")
    if shards:  # made by another tokenizer, or by one nobody recorded
        logger.warning("%s: removing %d token shard(s) made with another tokenizer or text field (%s; now %s)",
                       output_path, len(shards), before or "not recorded", identity)
        for shard in shards:
            fs.rm_file(shard)  # one by one: `rm` of a list globs each path again on object stores
    fs.makedirs(root, exist_ok=True)
    with atomic_write(f"{output_path}/{TOKENIZER_NAME}") as f:
        f.write(json.dumps(identity, sort_keys=True).encode())


def finish_token_cache(paths, output_path: str) -> dict:
    """Write ``output_path/ledger.json`` for the written shards (in shard order); returns the ledger."""
    return write_token_ledger(sorted(paths), f"{output_path.rstrip('/')}/{LEDGER_NAME}")


@dataclass(frozen=True)
class TokenizeConfig:
    """Tokenize the ``text_field`` of the JSONL/Parquet files matching ``input`` into a cache at ``output_path``."""

    input: str
    output_path: str
    tokenizer: str = "byte"
    eod_token: str | None = None
    text_field: str = "text"
    batch_size: int = 256
    backend: str = "sync"


def tokenize_to_cache(config: TokenizeConfig) -> dict:
    """An ``ExecutorStep`` function: the Zephyr tokenize pipeline, then the ledger (returned)."""
    records = Dataset.from_files(config.input).load_file()
    pipeline = tokenize_dataset(records, config.output_path, tokenizer=config.tokenizer, eod_token=config.eod_token,
                                text_field=config.text_field, batch_size=config.batch_size)
    return finish_token_cache(create_backend(config.backend).execute(pipeline), config.output_path)
