"""Tokenizers for the tokenize step: byte-level, or a Hugging Face ``tokenizer.json`` (BPE, ...).

Both encode a batch of texts at once (``encode_batch``; the Hugging Face one runs its Rust
batch encoder across threads) and end every document with an end-of-document id, so the
concatenated token stream keeps document boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from zephyr.io import open_input
from zephyr.io.files import file_versions

__all__ = ["ByteTokenizer", "HfTokenizer", "load_tokenizer"]


class ByteTokenizer:
    """UTF-8 bytes (ids 0-255) then ``eod_id`` (256 by default, making the vocabulary 257)."""

    def __init__(self, eod_id: int = 256):
        if not 0 <= eod_id <= 256:
            raise ValueError(f"a byte tokenizer's end-of-document id is a byte or 256, got {eod_id}")
        self.eod_id, self.vocab_size = eod_id, 257 if eod_id == 256 else 256

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[*text.encode("utf-8"), self.eod_id] for text in texts]


class HfTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer from a ``tokenizer.json`` (local or ``gs://``);
    whole documents: the file's padding and truncation settings, if any, are turned off."""

    def __init__(self, path: str, eod_token: str):
        from tokenizers import Tokenizer

        with open_input(path) as f:
            self.tokenizer = Tokenizer.from_str(f.read().decode("utf-8"))
        # A tokenizer.json may carry padding or truncation settings for model inputs; a cache holds
        # whole documents, so neither may apply (as transformers ignores them unless asked): padding
        # put pad ids between documents, by batch, and truncation cut documents short.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        eod_id = self.tokenizer.token_to_id(eod_token)
        if eod_id is None:
            special = sorted(t.content for t in self.tokenizer.get_added_tokens_decoder().values())
            raise ValueError(f"{path}: no end-of-document token {eod_token!r} in the vocabulary (added tokens: {special})")
        self.path, self.eod_id, self.vocab_size = path, eod_id, self.tokenizer.get_vocab_size()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [[*encoding.ids, self.eod_id] for encoding in encodings]


def load_tokenizer(spec: str = "byte", eod_token: str | None = None) -> ByteTokenizer | HfTokenizer:
    """``"byte"`` (``eod_token``: one ASCII character, or None for id 256) or a ``tokenizer.json``
    path (``eod_token`` required, e.g. ``"<|endoftext|>"``). Cached per process (shards share
    it) by the file's version too, so a ``tokenizer.json`` rewritten in place is read again."""
    return _load(spec, eod_token, None if spec == "byte" else _file_version(spec))


def _file_version(spec: str) -> str:
    return file_versions([spec])[spec]


@lru_cache(maxsize=8)
def _load(spec: str, eod_token: str | None, version: str | None) -> ByteTokenizer | HfTokenizer:
    if spec == "byte":
        if eod_token is None:
            return ByteTokenizer()
        if len(eod_token.encode("utf-8")) != 1:
            raise ValueError(f"a byte tokenizer's eod_token must be one ASCII character, got {eod_token!r}")
        return ByteTokenizer(eod_token.encode("utf-8")[0])
    if not eod_token:
        raise ValueError(f"{spec}: give eod_token, the end-of-document token of this tokenizer")
    return HfTokenizer(spec, eod_token)


# what lru_cache gave load_tokenizer itself: bench_token_cache.py times a cold load with it
load_tokenizer.cache_clear = _load.cache_clear  # type: ignore[attr-defined]
