"""Run ``train_loop`` on the tiny LM in a fresh process: for tests that kill a training
process, or run several processes as one multi-host JAX program (``--coordinator``).

    python train_tiny_lm.py --data 'dir/*.jsonl.zst' --ckpt dir/ckpt --steps 40 [--result out.json]
"""

from __future__ import annotations

import argparse
import functools
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=24)
    parser.add_argument("--embed", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fsdp", action="store_true", help="shard the state over the data axis")
    parser.add_argument("--coordinator", help="ip:port of process 0: join a multi-process JAX program")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--result", help="write the TrainResult (and this process's view) here as JSON")
    args = parser.parse_args()

    if args.coordinator:
        from marin.tpu.distributed import DistributedConfig, initialize

        initialize(DistributedConfig(args.coordinator, args.num_processes, args.process_id))
    import jax

    from marin.training import fsdp_sharding, tiny_lm, train_loop

    config = tiny_lm.TinyLMConfig(embed_dim=args.embed, hidden_dim=args.hidden)
    result = train_loop(
        functools.partial(tiny_lm.train_step, config=config), functools.partial(tiny_lm.init_state, config=config),
        args.data, batch_size=args.batch_size, seq_len=args.seq_len, num_steps=args.steps,
        checkpoint_path=args.ckpt, checkpoint_every=args.checkpoint_every, seed=args.seed, log_every=5,
        state_sharding=fsdp_sharding(min_size=256) if args.fsdp else None,
    )
    if args.result:
        with open(args.result, "w") as f:
            json.dump({"step": result.step, "metrics": result.metrics, "mesh": result.mesh,
                       "num_processes": result.num_processes, "resumed_from": result.resumed_from,
                       "process_index": jax.process_index(), "device_count": jax.device_count(),
                       "local_device_count": jax.local_device_count()}, f)


if __name__ == "__main__":
    main()
