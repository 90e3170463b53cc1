"""Training-adapter throughput: ``train_loop`` against a hand-written pure-JAX loop.

For each device count (simulated CPU devices, one fresh process per count) three loops train
the same model on the same token stream, data-parallel over a ``("data",)`` mesh of all the
devices, for the same number of steps, and end with one orbax checkpoint of the state:

- **adapter**: ``marin.tpu.train_loop`` reading tokenized ``.jsonl.zst`` shards (a
  background thread parses the next batches while the devices compute), each batch
  assembled with ``jax.make_array_from_process_local_data``, metrics every ``--log-every``
  steps, one asynchronous checkpoint at the end;
- **hand-written**: the loop a person would write: read the same shards record by record
  (``zephyr.io.read_jsonl``), cut batches with NumPy, ``jax.device_put`` them onto the same
  sharding, call the same jitted step, read the loss every ``--log-every`` steps, and save one
  orbax checkpoint at the end;
- **preloaded**: the same loop with the whole token stream in memory beforehand (loading not
  timed): the compute-only limit, with no data reading at all.

With ``--data cache`` the shards are a token cache (uint16 ``.npy`` shards and their ledger,
``zephyr.io.tokens``) instead: the adapter reads it through ``CacheBatches`` and the
hand-written loop memory-maps the ``.npy`` files. With ``--platform gpu`` one worker trains on
the machine's real accelerator (every device JAX finds) instead of simulated CPU devices, and
the table adds the achieved TFLOP/s (6 x the model's matmul parameters per token).

They run alternating round by round. The headline figures are steady-state tokens/s, from
step ``WARMUP`` on (compilation excluded): the best run of each (the least disturbed by other
work on a shared machine) and the adapter's speed as a ratio of the hand-written loop's, best
and median. One more column gives the end-to-end ratio (initialisation, compilation and the
final checkpoint included).

    uv run python benchmarks/bench_train.py --json benchmarks/results/train.json
    python benchmarks/bench_train.py --platform gpu --data cache --vocab 32768 --embed 1024 --hidden 4096 \
        --batch-size 64 --seq-len 1024 --json train_gpu.json
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import load_average, machine, work_dir  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8], help="simulated device counts")
    parser.add_argument("--steps", type=int, default=100, help="training steps per run")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (rows)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per row")
    parser.add_argument("--embed", type=int, default=128, help="tiny LM embedding width")
    parser.add_argument("--hidden", type=int, default=512, help="tiny LM hidden width")
    parser.add_argument("--vocab", type=int, default=256, help="tiny LM vocabulary (the tokens stay in 32..126)")
    parser.add_argument("--platform", choices=["cpu", "gpu"], default="cpu",
                        help="cpu: --devices simulated CPU devices; gpu: the machine's accelerator, as JAX finds it")
    parser.add_argument("--data", choices=["jsonl", "cache"], default="jsonl",
                        help="token shards as .jsonl.zst records or as a token cache (.npy + ledger)")
    parser.add_argument("--log-every", type=int, default=1,
                        help="steps between metric reads (1: every step is synchronised, so step timings are exact)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop per device count")
    parser.add_argument("--shards", type=int, default=8, help="token shards to generate")
    parser.add_argument("--work-dir", help="keep the corpus and checkpoints here (default: a temporary dir)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---- the corpus -----------------------------------------------------------------------------


def write_corpus(directory: str, shards: int, tokens_needed: int, form: str = "jsonl") -> str:
    """``shards`` files of byte-token records, enough tokens for one pass: ``.jsonl.zst``
    (returns their glob) or a token cache (returns its ledger)."""
    import numpy as np
    from zephyr.io import write_jsonl_file
    from zephyr.io.tokens import write_token_ledger, write_tokens_file

    directory = os.path.join(directory, form)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per_shard = tokens_needed // shards + 1
    paths = []
    for shard in range(shards):
        path = os.path.join(directory, f"part-{shard:05d}.jsonl.zst" if form == "jsonl" else f"part-{shard:05d}.npy")
        paths.append(path)
        if os.path.exists(path):
            continue
        lengths = rng.integers(200, 2000, size=per_shard // 1000 + 2)
        records = [{"input_ids": rng.integers(32, 127, size=int(n)).tolist()} for n in lengths]
        if form == "jsonl":
            write_jsonl_file(records, path)
        else:
            write_tokens_file(records, path, dtype="uint16")
    if form == "jsonl":
        return os.path.join(directory, "part-*.jsonl.zst")
    ledger = os.path.join(directory, "ledger.json")
    write_token_ledger(paths, ledger)
    return ledger


# ---- one device count, in a fresh process ----------------------------------------------------


CALLS: list[float] = []  # when each train_step call of the current run began


def timed_step(step, state, batch):
    CALLS.append(time.perf_counter())
    return step(state, batch)


def model(args):
    from marin.training import tiny_lm

    config = tiny_lm.TinyLMConfig(vocab_size=args.vocab, embed_dim=args.embed, hidden_dim=args.hidden)
    step = functools.partial(timed_step, functools.partial(tiny_lm.train_step, config=config))
    return step, functools.partial(tiny_lm.init_state, config=config), config


def measured(run) -> tuple[float, float]:
    """(seconds end to end, seconds per step in the steady state: from the call of step
    WARMUP to the call of the last step, each step synchronised by its metric read)."""
    CALLS.clear()
    total = run()
    calls = CALLS[WARMUP:]
    return total, (calls[-1] - calls[0]) / (len(calls) - 1)


WARMUP = 10


def run_adapter(args, data: str, checkpoint_path: str) -> float:
    from marin.training import train_loop

    step, init, _ = model(args)
    start = time.perf_counter()
    train_loop(step, init, data, batch_size=args.batch_size, seq_len=args.seq_len, num_steps=args.steps,
               checkpoint_path=checkpoint_path, checkpoint_every=args.steps, log_every=args.log_every)
    return time.perf_counter() - start


def _documents(data: str):
    """Each document's tokens, in shard order, forever: records of the ``.jsonl.zst`` shards,
    or, for a token cache, each ``.npy`` shard memory-mapped whole (a shard's documents are
    contiguous, so the stream is the same)."""
    import itertools

    import numpy as np
    from zephyr.io import expand_glob, read_jsonl

    if data.endswith("ledger.json"):
        shards = sorted(glob.glob(os.path.join(os.path.dirname(data), "part-*.npy")))
        for path in itertools.cycle(shards):
            yield np.load(path, mmap_mode="r").astype(np.int32)
        return
    for path in itertools.cycle(sorted(expand_glob(data))):
        for record in read_jsonl(path):
            yield np.asarray(record["input_ids"], dtype=np.int32)


def file_batches(data: str, batch_size: int, seq_len: int):
    """The hand-written reader: documents in sorted shard order, concatenated, cut into batches."""
    import numpy as np

    need, pending, have = batch_size * seq_len, [], 0
    for document in _documents(data):
        pending.append(document)
        have += len(document)
        while have >= need:
            tokens = np.concatenate(pending)
            yield tokens[:need].reshape(batch_size, seq_len)
            pending, have = [tokens[need:]], have - need


def run_hand_written(args, batches, checkpoint_path: str) -> float:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    step, init, _ = model(args)
    start = time.perf_counter()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    state = jax.jit(init, out_shardings=replicated)(jax.random.key(0))
    batches = batches()
    for i in range(args.steps):
        batch = jax.device_put(next(batches), rows)
        state, metrics = step(state, batch)
        if (i + 1) % args.log_every == 0:
            float(metrics["loss"])
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(checkpoint_path, str(args.steps)), state)
        checkpointer.wait_until_finished()
    return time.perf_counter() - start


def load_stream(data: str, tokens: int):
    import numpy as np

    return next(file_batches(data, 1, tokens)).ravel()


def worker(args) -> None:
    import jax

    data = os.environ["BENCH_TRAIN_DATA"]
    stream = load_stream(data, args.steps * args.batch_size * args.seq_len)
    size = args.batch_size * args.seq_len
    runners = {
        "adapter": lambda path: run_adapter(args, data, path),
        "hand_written": lambda path: run_hand_written(
            args, lambda: file_batches(data, args.batch_size, args.seq_len), path),
        "preloaded": lambda path: run_hand_written(
            args, lambda: (stream[i * size : (i + 1) * size].reshape(args.batch_size, args.seq_len)
                           for i in range(args.steps)), path),
    }
    times = {name: [] for name in runners}
    step_times = {name: [] for name in runners}
    root = tempfile.mkdtemp(prefix="bench-train-ckpt-", dir=os.environ.get("BENCH_TRAIN_WORK"))
    names = list(runners)
    for repeat in range(args.repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:  # rotate the order round by round
            total, per_step = measured(functools.partial(runners[name], os.path.join(root, f"{name}-{repeat}")))
            times[name].append(total)
            step_times[name].append(per_step)
    _, _, config = model(args)
    params = config.vocab_size * config.embed_dim + config.embed_dim * config.hidden_dim + config.hidden_dim \
        + config.hidden_dim * config.vocab_size
    print(json.dumps({"devices": jax.device_count(), "times": times, "step_times": step_times, "params": params,
                      "matmul_params": config.embed_dim * config.hidden_dim + config.hidden_dim * config.vocab_size,
                      "device_kind": jax.devices()[0].device_kind, "backend": jax.default_backend()}))


# ---- the driver ----------------------------------------------------------------------------------


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    with work_dir(args.work_dir, "bench-train-") as work:
        return _drive(args, argv, work)


def _drive(args: argparse.Namespace, argv, work: str) -> dict:
    """One worker process per device count, then the table and the JSON."""
    data = write_corpus(os.path.join(work, "tokens"), args.shards, args.steps * args.batch_size * args.seq_len, args.data)
    load_before = load_average()
    rows = []
    for devices in (args.devices if args.platform == "cpu" else [None]):
        env = {**os.environ, "BENCH_TRAIN_DATA": data, "BENCH_TRAIN_WORK": work}
        if devices is None:  # the real accelerator, every device of it
            env.pop("JAX_PLATFORMS", None)
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        else:
            env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
        command = [sys.executable, os.path.abspath(__file__), "--worker", *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"worker for {devices} devices failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        tokens = args.steps * args.batch_size * args.seq_len
        per_batch = args.batch_size * args.seq_len
        adapter, hand, pre = (result["step_times"][k] for k in ("adapter", "hand_written", "preloaded"))
        totals = result["times"]
        tflops = 6 * result["matmul_params"] * per_batch / min(adapter) / 1e12
        rows.append({"devices": result["devices"], "device_kind": result["device_kind"], "backend": result["backend"],
                     "adapter_tflops": tflops, "params": result["params"], "tokens": tokens,
                     "end_to_end_s": totals, "step_s": result["step_times"],
                     "adapter_tokens_per_s": per_batch / min(adapter), "hand_written_tokens_per_s": per_batch / min(hand),
                     "preloaded_tokens_per_s": per_batch / min(pre),
                     "ratio": min(hand) / min(adapter),
                     "median_ratio": statistics.median(hand) / statistics.median(adapter),
                     "ratio_to_preloaded": min(pre) / min(adapter),
                     "end_to_end_ratio": min(totals["hand_written"]) / min(totals["adapter"])})
    report = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "json")}, "machine": machine(),
              "load_before": load_before, "load_after": load_average(), "rows": rows}
    print(f"tiny LM, {rows[0]['params']:,} parameters, batch {args.batch_size} x {args.seq_len}, {args.steps} steps, "
          f"best of {args.repeats}; load average {load_before} -> {report['load_after']}\n")
    print(f"steady state (after the first {WARMUP} steps), tokens/s of the best run:\n")
    print("| devices | adapter | hand-written | preloaded | adapter / hand-written (best) | (median) "
          "| adapter / preloaded | end to end, adapter / hand-written | adapter TFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['devices']} x {row['device_kind']} | {row['adapter_tokens_per_s']:,.0f} "
              f"| {row['hand_written_tokens_per_s']:,.0f} "
              f"| {row['preloaded_tokens_per_s']:,.0f} | {row['ratio']:.2f}x | {row['median_ratio']:.2f}x "
              f"| {row['ratio_to_preloaded']:.2f}x | {row['end_to_end_ratio']:.2f}x | {row['adapter_tflops']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
