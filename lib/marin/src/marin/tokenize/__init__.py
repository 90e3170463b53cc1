"""Tokenization into Zephyr token caches: byte-level and Hugging Face tokenizers, and the step."""

from marin.tokenize.cache_step import TokenizeConfig, finish_token_cache, tokenize_dataset, tokenize_to_cache
from marin.tokenize.tokenizers import ByteTokenizer, HfTokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer",
    "HfTokenizer",
    "TokenizeConfig",
    "finish_token_cache",
    "load_tokenizer",
    "tokenize_dataset",
    "tokenize_to_cache",
]
