"""The tokenize step: texts -> a Zephyr token cache (``Dataset.write_tokens`` + ``ledger.json``).

``tokenize_dataset`` adds the encoding and the writer to any Zephyr dataset of records with a
text field; ``finish_token_cache`` writes the ledger once every shard is written (it reads
only the shards' headers). ``tokenize_to_cache`` is both as an ``ExecutorStep`` function.
Shards are written atomically and ``skip_existing``: a rerun after a crash redoes only the
shards that are missing.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from zephyr import Dataset, counters, create_backend
from zephyr.io.tokens import LEDGER_NAME, write_token_ledger

from marin.tokenize.tokenizers import load_tokenizer

__all__ = ["TokenizeConfig", "finish_token_cache", "tokenize_dataset", "tokenize_to_cache"]


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
    ids when the vocabulary fits, else uint32); run it, then call :func:`finish_token_cache`."""
    vocab = load_tokenizer(tokenizer, eod_token).vocab_size
    encode = functools.partial(_encode_shard, spec=tokenizer, eod_token=eod_token, text_field=text_field,
                               batch_size=batch_size)
    return dataset.map_shard(encode).write_tokens(
        f"{output_path.rstrip('/')}/part-{{shard:05d}}.npy", dtype="uint16" if vocab <= 1 << 16 else "uint32",
        skip_existing=True,
    )


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
