"""Token cache (issue 28): loader speed and bytes per host, and tokenize-step throughput.

1. **Loader**: the same token stream as a token cache (``.npy`` shards + ledger, uint16) and
   as ``.jsonl.zst`` token shards. For H simulated hosts, host 0 reads its rows
   (``batch_size / H``) of every batch for one epoch: tokens/s (its own rows' tokens per
   second) and bytes read (the cache reader's ranged reads; for JSON every host reads every
   shard, so its bytes are the shards' size). For scale, the tiny LM's jitted step on one CPU
   device at the same batch shape (tokens/s it consumes).
2. **Tokenize**: a BPE (trained here on the corpus, vocabulary ``--vocab``) over the
   ``"text"`` of JSONL documents: the Zephyr step (``marin.tokenize.tokenize_to_cache``, sync
   backend, ledger included) vs a hand-written loop (read lines, ``encode_batch`` in batches of
   the same size, write one ``.npy`` per input file), docs/s and tokens/s.

    uv run python benchmarks/bench_token_cache.py --json benchmarks/results/token_cache.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import load_average, machine, work_dir  # noqa: E402

WORDS = ("time data model token the of and to in is was for on with as by at from it that this "
         "shard cache host read write byte tensor train step loss batch epoch slice").split()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20000, help="documents in the corpus")
    parser.add_argument("--files", type=int, default=8, help="input files / shards")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch rows")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--vocab", type=int, default=2000, help="BPE vocabulary size")
    parser.add_argument("--work-dir")
    parser.add_argument("--json")
    return parser.parse_args(argv)


def write_texts(root: str, docs: int, files: int) -> list[str]:
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    paths = []
    for f in range(files):
        path = f"{root}/docs-{f:03d}.jsonl"
        with open(path, "w") as out:
            for _ in range(docs // files):
                n = int(rng.integers(20, 400))
                out.write(json.dumps({"text": " ".join(rng.choice(WORDS, size=n))}) + "\n")
        paths.append(path)
    return paths


def train_bpe(paths: list[str], vocab: int, out: str) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator((json.loads(line)["text"] for p in paths for line in open(p)), trainer)
    tokenizer.save(out)
    return out


def hand_written_tokenize(paths: list[str], spec: str, out: str, batch: int) -> tuple[int, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(spec)
    eod = tokenizer.token_to_id("<|endoftext|>")
    os.makedirs(out, exist_ok=True)
    docs = tokens = 0
    for i, path in enumerate(paths):
        with open(path) as f:
            texts = [json.loads(line)["text"] for line in f]
        ids = []
        for start in range(0, len(texts), batch):
            for enc in tokenizer.encode_batch(texts[start : start + batch], add_special_tokens=False):
                ids.extend(enc.ids)
                ids.append(eod)
        np.save(f"{out}/part-{i:05d}.npy", np.asarray(ids, dtype=np.uint16))
        docs, tokens = docs + len(texts), tokens + len(ids)
    return docs, tokens


def loader_rate(make, steps: int, rows: int, seq_len: int) -> tuple[float, object]:
    reader = make()
    start = time.perf_counter()
    for _ in range(steps):
        next(reader)
    seconds = time.perf_counter() - start
    return rows * seq_len * steps / seconds, reader


def step_rate(batch: int, seq_len: int) -> float:
    import jax
    import jax.numpy as jnp

    from marin.training import tiny_lm

    state = tiny_lm.init_state(jax.random.key(0))
    tokens = jnp.zeros((batch, seq_len), dtype=jnp.int32)
    state, metrics = tiny_lm.train_step(state, tokens)
    jax.block_until_ready(metrics)
    start, steps = time.perf_counter(), 20
    for _ in range(steps):
        state, metrics = tiny_lm.train_step(state, tokens)
    jax.block_until_ready(metrics)
    return batch * seq_len * steps / (time.perf_counter() - start)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from zephyr import Dataset, create_backend

    from marin.tokenize import TokenizeConfig, load_tokenizer, tokenize_to_cache
    from marin.training.data import TokenBatches
    from marin.training.token_cache import CacheBatches

    results: dict = {"machine": machine(), "load_before": load_average(), "args": vars(args)}
    with work_dir(args.work_dir, "bench-token-cache-") as root:
        texts = write_texts(f"{root}/texts", args.docs, args.files)
        spec = train_bpe(texts, args.vocab, f"{root}/tokenizer.json")
        load_tokenizer.cache_clear()
        start = time.perf_counter()
        ledger = tokenize_to_cache(TokenizeConfig(input=f"{root}/texts/*.jsonl", output_path=f"{root}/cache-{time.time_ns()}",
                                                  tokenizer=spec, eod_token="<|endoftext|>", batch_size=256))
        zephyr_s = time.perf_counter() - start
        start = time.perf_counter()
        docs, tokens = hand_written_tokenize(texts, spec, f"{root}/hand", 256)
        hand_s = time.perf_counter() - start
        assert (docs, tokens) == (ledger["documents"], ledger["tokens"])
        results["tokenize"] = {"docs": docs, "tokens": tokens, "zephyr_s": zephyr_s, "hand_s": hand_s}
        cache = f"{root}/cache"
        if not os.path.exists(f"{cache}/ledger.json"):
            os.rename(glob.glob(f"{root}/cache-*")[0], cache)
        # the same stream as JSON token shards
        ids = [np.load(p) for p in sorted(glob.glob(f"{cache}/part-*[0-9].npy"))]
        offsets = [np.load(p) for p in sorted(glob.glob(f"{cache}/part-*.offsets.npy"))]
        shards = [[{"input_ids": a[o[i] : o[i + 1]].tolist()} for i in range(len(o) - 1)] for a, o in zip(ids, offsets)]
        json_paths = sorted(create_backend("sync").execute(
            Dataset.from_list(shards).flat_map(list).write_jsonl(f"{root}/json/part-{{shard:05d}}.jsonl.zst", skip_existing=True)))
        json_bytes = sum(os.path.getsize(p) for p in json_paths)
        batch, seq = args.batch_size, args.seq_len
        steps = tokens // (batch * seq)
        results["loader"] = []
        for hosts in args.hosts:
            rows = [(0, batch // hosts)]
            cache_rate, reader = loader_rate(lambda: CacheBatches(cache, batch_size=batch, seq_len=seq, rows=rows),
                                             steps, batch // hosts, seq)
            json_rate, _ = loader_rate(lambda: TokenBatches(json_paths, batch_size=batch, seq_len=seq, rows=rows),
                                       steps, batch // hosts, seq)
            results["loader"].append({"hosts": hosts, "cache_tokens_s": cache_rate, "json_tokens_s": json_rate,
                                      "cache_bytes": reader.cache.bytes_read, "json_bytes": json_bytes,
                                      "epoch_token_bytes": steps * batch * seq * 2})
        results["tiny_lm_step_tokens_s"] = step_rate(batch, seq)
    results["load_after"] = load_average()
    print_tables(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def print_tables(r: dict) -> None:
    t = r["tokenize"]
    print(f"load average before {r['load_before']}, after {r['load_after']}; {r['machine']['cores']} cores")
    print("\n| tokenizer loop | seconds | docs/s | tokens/s | ratio |\n|---|---:|---:|---:|---:|")
    for name, s in (("zephyr tokenize step (sync)", t["zephyr_s"]), ("hand-written loop", t["hand_s"])):
        print(f"| {name} | {s:.2f} | {t['docs'] / s:,.0f} | {t['tokens'] / s:,.0f} | {t['hand_s'] / s:.2f}x |")
    print(f"\n{t['docs']:,} documents, {t['tokens']:,} tokens; tiny LM step (1 CPU device, same batch): "
          f"{r['tiny_lm_step_tokens_s']:,.0f} tokens/s")
    print("\n| hosts | cache tokens/s per host | JSON tokens/s per host | cache / JSON | cache bytes per host | "
          "share of the epoch's token bytes | JSON bytes per host |\n|---:|---:|---:|---:|---:|---:|---:|")
    for row in r["loader"]:
        print(f"| {row['hosts']} | {row['cache_tokens_s']:,.0f} | {row['json_tokens_s']:,.0f} | "
              f"{row['cache_tokens_s'] / row['json_tokens_s']:.1f}x | {row['cache_bytes']:,} | "
              f"{row['cache_bytes'] / row['epoch_token_bytes']:.4f} (1/H = {1 / row['hosts']:.4f}) | {row['json_bytes']:,} |")


if __name__ == "__main__":
    main()
