"""Train a tiny byte-level language model on a TPU slice: Zephyr tokenizes, marin.tpu trains.

Two executor steps:

1. ``tiny_lm/tokens``: a Zephyr pipeline tokenizes the text into a token cache
   (``part-NNNNN.npy`` token arrays + ``ledger.json``), which each training host reads only
   its own rows of;
2. ``tiny_lm/train``: ``train_on_tpu`` runs the training loop on a ``v4-8`` slice,
   checkpointing under the step's output path; a preempted run resumes where it stopped.

On a cluster (``RAY_ADDRESS`` set, e.g. through ``ray_run``) it runs on a real slice. With
no cluster it starts a local Ray whose only node pretends to be a v4-8 host, and JAX runs on
the CPU, so the same script works on a laptop::

    uv run python experiments/train_tiny_lm.py --prefix /tmp/marin-tiny
"""

from __future__ import annotations

import logging
import os

from marin.execution import ExecutorStep, executor_main, output_path_of, this_output_path, versioned
from marin.tpu import simulated_host
from marin.training.tiny_lm import TokenizeConfig, TrainConfig, read_result, tokenize_corpus, train

TPU_TYPE = "v4-8"

CORPUS = tuple(
    f"{i}: " + line
    for i, line in enumerate(
        [
            "It was the best of times, it was the worst of times.",
            "The quick brown fox jumps over the lazy dog.",
            "All happy families are alike; each unhappy family is unhappy in its own way.",
            "Call me Ishmael. Some years ago, never mind how long precisely.",
            "It is a truth universally acknowledged, that a single man in possession of a good fortune",
            "In the beginning the Universe was created. This has made a lot of people very angry.",
        ]
        * 20
    )
)

tokens = ExecutorStep(
    name="tiny_lm/tokens",
    fn=tokenize_corpus,
    config=TokenizeConfig(output_path=this_output_path(), texts=versioned(list(CORPUS)), num_shards=4),
    description="Byte-tokenize a small corpus with Zephyr.",
)

train_step = ExecutorStep(
    name="tiny_lm/train",
    fn=train,
    config=TrainConfig(
        tokens=output_path_of(tokens),
        output_path=this_output_path(),
        tpu_type=versioned(TPU_TYPE),
        batch_size=versioned(8),
        seq_len=versioned(64),
        num_steps=versioned(200),
        checkpoint_every=50,
    ),
    description="Train the tiny byte-level LM on a TPU slice (survives preemption).",
)


def _connect_or_simulate() -> None:
    """Join the cluster in RAY_ADDRESS, or start a local Ray that looks like one v4-8 host."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    from zephyr.backends.ray_local import start_local_ray

    logging.getLogger(__name__).info("no RAY_ADDRESS: simulating one %s host on this machine (JAX on CPU)", TPU_TYPE)
    # a new Ray of our own (not one some other process started here), its workers in this
    # interpreter, quiet, on free ports; its workers' JAX sees one CPU device per chip of the
    # host, so training runs data-parallel over 4 devices
    print(f"train_tiny_lm: {start_local_ray(**simulated_host(TPU_TYPE))}", flush=True)


def report(outcomes: dict[str, str]) -> str:
    """One line on the training step: trained or skipped, final step and loss, checkpoints."""
    path, outcome = next((p, o) for p, o in outcomes.items() if "tiny_lm/train" in p)
    result = read_result(path)
    if result is None:
        return f"train_tiny_lm: {outcome.lower()}, but {path} holds no result.json (trained by an older version)"
    verb = "trained" if outcome == "SUCCESS" else "already trained (skipped)"
    loss = result["metrics"].get("loss")
    return (f"train_tiny_lm: {verb} to step {result['step']}, loss {loss:.3f}; "
            f"checkpoints in {result['checkpoint_path']}")


def main(args: list[str] | None = None) -> None:
    """Ray only when a step will run: a finished run reports its result in seconds."""
    import draccus

    from marin.execution import Executor
    from marin.execution.main import ExecutorMainConfig

    config = draccus.parse(config_class=ExecutorMainConfig, args=args)
    steps = [tokens, train_step]
    prefix = config.prefix or os.environ.get("MARIN_PREFIX")
    if prefix and not config.dry_run and any(
            action != "skip" for action in Executor(prefix).dry_run(steps, config.run_only, out=lambda line: None).values()):
        _connect_or_simulate()  # (without a prefix executor_main stops, saying what to pass)
    print(report(executor_main(steps, description="Tiny byte-level LM trained with marin.tpu.", config=config)), flush=True)


if __name__ == "__main__":
    main()
