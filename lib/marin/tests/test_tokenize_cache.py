"""The tokenize step (issue 28): byte-level and a BPE trained here (no hub is reachable) into a
token cache; the oracle is the tokenizer's own per-document encode plus the end-of-document id."""

from __future__ import annotations

import hashlib
import json

import pytest

from marin.tokenize import TokenizeConfig, load_tokenizer, tokenize_to_cache
from marin.training.token_cache import TokenCache

CORPUS = [f"{i}: the quick brown fox jumps over the lazy dog; all happy families are alike." * (1 + i % 3)
          for i in range(40)]


def _write_corpus(root) -> str:
    for part in range(3):
        with open(root / f"docs-{part}.jsonl", "w") as f:
            for text in CORPUS[part::3]:
                f.write(json.dumps({"text": text}) + "\n")
    return str(root / "docs-*.jsonl")


def _train_bpe(path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(path))
    return str(path)


def _expected(encode) -> list[int]:
    """Documents in the order the step reads them: files sorted, lines in order."""
    return [t for part in range(3) for text in CORPUS[part::3] for t in encode(text)]


def test_bpe_tokenize_step_writes_the_documents_with_eod(tmp_path):
    from tokenizers import Tokenizer

    spec = _train_bpe(tmp_path / "tokenizer.json")
    reference = Tokenizer.from_file(spec)
    eod = reference.token_to_id("<|endoftext|>")
    ledger = tokenize_to_cache(TokenizeConfig(input=_write_corpus(tmp_path), output_path=str(tmp_path / "cache"),
                                              tokenizer=spec, eod_token="<|endoftext|>", batch_size=4))
    assert ledger["documents"] == len(CORPUS) and len(ledger["shards"]) == 3
    assert {s["dtype"] for s in ledger["shards"]} == {"uint16"}
    want = _expected(lambda text: reference.encode(text, add_special_tokens=False).ids + [eod])
    cache = TokenCache(str(tmp_path / "cache"))
    assert cache.read(0, cache.total).tolist() == want
    assert len(want) < sum(len(t.encode()) for t in CORPUS)  # the BPE merged something


def test_a_tokenizer_json_with_padding_and_truncation_still_writes_whole_documents(tmp_path):
    """Regression: a tokenizer.json saved with padding (and truncation) enabled, as many are for
    model inputs, padded each encode_batch to its longest document, so pad ids sat between the
    documents of the cache, and cut every document at max_length. The oracle is the tokenizer's
    own per-document encode with both turned off, plus the end-of-document id."""
    from tokenizers import Tokenizer

    spec = _train_bpe(tmp_path / "tokenizer.json")
    saved = Tokenizer.from_file(spec)
    saved.enable_padding(pad_id=0, pad_token="<unk>")
    saved.enable_truncation(max_length=70)  # documents are 28 to 87 tokens: some cut, some padded
    saved.save(spec)
    tokenize_to_cache(TokenizeConfig(input=_write_corpus(tmp_path), output_path=str(tmp_path / "cache"),
                                     tokenizer=spec, eod_token="<|endoftext|>", batch_size=4))
    reference = Tokenizer.from_file(spec)
    reference.no_padding()
    reference.no_truncation()
    eod = reference.token_to_id("<|endoftext|>")
    cache = TokenCache(str(tmp_path / "cache"))
    assert cache.read(0, cache.total).tolist() == _expected(
        lambda text: reference.encode(text, add_special_tokens=False).ids + [eod])


def test_a_cache_made_before_padding_was_turned_off_is_made_again(tmp_path):
    """Regression: caches written with a padded tokenizer.json before padding was turned off
    have a marker equal to today's (same spec, eod, file digest), so a rerun kept their shards.
    Here the old shards are stood in for by another tokenization of the same corpus."""
    import shutil

    from tokenizers import Tokenizer

    spec = _train_bpe(tmp_path / "tokenizer.json")
    saved = Tokenizer.from_file(spec)
    saved.enable_padding(pad_id=0, pad_token="<unk>")
    saved.save(spec)
    inputs, cache_dir = _write_corpus(tmp_path), tmp_path / "cache"
    tokenize_to_cache(TokenizeConfig(input=inputs, output_path=str(tmp_path / "bytes")))
    tokenize_to_cache(TokenizeConfig(input=inputs, output_path=str(cache_dir), tokenizer=spec, eod_token="<|endoftext|>"))
    old_marker = {"tokenizer": spec, "eod_token": "<|endoftext|>", "text_field": "text",
                  "sha256": hashlib.sha256(open(spec, "rb").read()).hexdigest()}  # as the old code wrote it
    (cache_dir / ".tokenizer.json").write_text(json.dumps(old_marker, sort_keys=True))
    for shard in (tmp_path / "bytes").glob("part-*.npy"):  # the old, wrong shards
        shutil.copy(shard, cache_dir / shard.name)
    assert sorted(p.name for p in (tmp_path / "bytes").glob("part-*")) == sorted(p.name for p in cache_dir.glob("part-*"))

    tokenize_to_cache(TokenizeConfig(input=inputs, output_path=str(cache_dir), tokenizer=spec, eod_token="<|endoftext|>"))
    reference = Tokenizer.from_file(spec)
    reference.no_padding()
    eod = reference.token_to_id("<|endoftext|>")
    cache = TokenCache(str(cache_dir))
    assert cache.read(0, cache.total).tolist() == _expected(
        lambda text: reference.encode(text, add_special_tokens=False).ids + [eod])


def test_byte_tokenize_step_and_errors(tmp_path):
    tokenize_to_cache(TokenizeConfig(input=_write_corpus(tmp_path), output_path=str(tmp_path / "cache")))
    cache = TokenCache(str(tmp_path / "cache"))
    assert cache.read(0, cache.total).tolist() == _expected(lambda text: [*text.encode(), 256])
    with pytest.raises(ValueError, match="no end-of-document token '<eos>'"):
        load_tokenizer(_train_bpe(tmp_path / "tok.json"), "<eos>")
    with pytest.raises(ValueError, match="give eod_token"):
        load_tokenizer(str(tmp_path / "tok.json"))


def test_a_record_without_text_fails_naming_the_record_and_field(tmp_path):
    (tmp_path / "docs-0.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(Exception, match=r"record 1: field 'text' must be a string") as caught:
        tokenize_to_cache(TokenizeConfig(input=str(tmp_path / "docs-*.jsonl"), output_path=str(tmp_path / "cache")))
    assert "docs-0.jsonl" in str(caught.value) or "shard 0" in str(caught.value)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("part-*"))


def test_a_rerun_with_another_tokenizer_rewrites_every_shard(tmp_path):
    """Regression: shards are written skip_existing, and Zephyr keeps outputs made by other code
    from the same input, so a rerun with another eod_token (or a rewritten tokenizer.json) kept
    the old shards beside new ones: one cache of two tokenizations, no error. The oracle is the
    byte tokenizer's per-document encode with the new end-of-document id."""
    corpus = _write_corpus(tmp_path)
    config = TokenizeConfig(input=corpus, output_path=str(tmp_path / "cache"))
    tokenize_to_cache(config)
    # the second run fails on one file after the others are written (the user then fixes it)
    bad = tmp_path / "docs-1.jsonl"
    good_text = bad.read_text()
    bad.write_text(good_text + json.dumps({"body": "no text"}) + "\n")
    newline = TokenizeConfig(input=corpus, output_path=str(tmp_path / "cache"), eod_token="\n")
    with pytest.raises(Exception, match="field 'text' must be a string"):
        tokenize_to_cache(newline)
    assert not (tmp_path / "cache" / "ledger.json").exists()  # no ledger over shards it does not describe
    bad.write_text(good_text)
    tokenize_to_cache(newline)
    cache = TokenCache(str(tmp_path / "cache"))
    assert cache.read(0, cache.total).tolist() == _expected(lambda text: [*text.encode(), 10])
    # the same tokenizer again: the shards are kept (skip_existing), not rewritten
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("part-*.npy")}
    tokenize_to_cache(newline)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("part-*.npy")} == before


def test_a_rerun_on_another_text_field_rewrites_every_shard(tmp_path):
    """Regression: the tokenizer marker did not record text_field, and Zephyr keeps outputs made
    by other code from the same input, so a rerun encoding another field kept the shards of the
    first field: the cache silently held the old texts. The oracle is the byte encode of the new field."""
    (tmp_path / "docs-0.jsonl").write_text("".join(json.dumps({"text": t, "title": t[:9]}) + "\n" for t in CORPUS))
    corpus, out = str(tmp_path / "docs-*.jsonl"), str(tmp_path / "cache")
    tokenize_to_cache(TokenizeConfig(input=corpus, output_path=out))
    tokenize_to_cache(TokenizeConfig(input=corpus, output_path=out, text_field="title"))
    cache = TokenCache(out)
    assert cache.read(0, cache.total).tolist() == [t for text in CORPUS for t in [*text[:9].encode(), 256]]


def test_a_cache_folder_named_with_brackets_is_rewritten_for_another_tokenizer(tmp_path):
    """Regression: the old shards were found by a glob over the cache folder, which read
    `cache[1]` as a pattern and found none, so a rerun with another eod_token kept them."""
    corpus = _write_corpus(tmp_path)
    out = str(tmp_path / "cache[1]")
    tokenize_to_cache(TokenizeConfig(input=corpus, output_path=out))
    tokenize_to_cache(TokenizeConfig(input=corpus, output_path=out, eod_token="\n"))
    cache = TokenCache(out)
    assert cache.read(0, cache.total).tolist() == _expected(lambda text: [*text.encode(), 10])


def test_a_rewritten_tokenizer_json_counts_as_another_tokenizer(tmp_path):
    spec = _train_bpe(tmp_path / "tokenizer.json")
    config = TokenizeConfig(input=_write_corpus(tmp_path), output_path=str(tmp_path / "cache"), tokenizer=spec,
                            eod_token="<|endoftext|>")
    tokenize_to_cache(config)
    first = TokenCache(str(tmp_path / "cache")).total
    # the same path, another vocabulary: bytes only (no merges), so more tokens per document
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bytes_only = Tokenizer(models.BPE(unk_token="<unk>"))
    bytes_only.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bytes_only.train_from_iterator([], trainers.BpeTrainer(vocab_size=10, special_tokens=["<unk>", "<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bytes_only.save(spec)  # this process loaded the old one from the same path: read again, by its version
    tokenize_to_cache(config)
    reference = Tokenizer.from_file(spec)
    eod = reference.token_to_id("<|endoftext|>")
    cache = TokenCache(str(tmp_path / "cache"))
    assert cache.read(0, cache.total).tolist() == _expected(lambda text: reference.encode(text, add_special_tokens=False).ids + [eod])
    assert cache.total > first


def test_a_batch_size_below_one_is_refused_before_anything_runs(tmp_path):
    """Regression: batch_size=0 encoded nothing and wrote an empty cache, with success."""
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tokenize_to_cache(TokenizeConfig(input=_write_corpus(tmp_path), output_path=str(tmp_path / "cache"), batch_size=0))
    assert not (tmp_path / "cache").exists()
