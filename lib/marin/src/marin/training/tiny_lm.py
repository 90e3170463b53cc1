"""A tiny byte-level language model in pure JAX + optax, for examples and tests.

The model predicts the next byte from the current one: embed the byte, one ``tanh`` hidden
layer, logits over the vocabulary (a neural bigram model). It is small enough to train in
seconds on a CPU and exercises everything the training adapter needs: a params pytree,
optax optimizer state, a jitted step, and a typed PRNG key in the state.

    from marin.training import tiny_lm, train_on_tpu
    train_on_tpu(tiny_lm.train_step, tiny_lm.init_state, "gs://b/tokens",  # a token cache
                 tpu_type="v4-8", batch_size=8, seq_len=64, num_steps=200, checkpoint_path="gs://b/ckpt")

``encode``/``decode`` turn text into byte token ids and back (vocabulary 256).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from zephyr import Dataset, create_backend
from zephyr.io.files import atomic_write, url_to_fs

from marin.tokenize import finish_token_cache, tokenize_dataset
from marin.training.train import train_on_tpu

__all__ = [
    "TinyLMConfig",
    "TokenizeConfig",
    "TrainConfig",
    "decode",
    "encode",
    "init_state",
    "loss_fn",
    "tokenize_corpus",
    "train",
    "train_step",
]


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 256
    embed_dim: int = 32
    hidden_dim: int = 64
    learning_rate: float = 1e-2


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids."""
    return list(text.encode("utf-8"))


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def _optimizer(config: TinyLMConfig) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def init_state(key: jax.Array, config: TinyLMConfig = TinyLMConfig()) -> dict:
    """Parameters, Adam state, a step counter and a PRNG key derived from ``key``."""
    k_embed, k_hidden, k_out, k_state = jax.random.split(key, 4)
    v, e, h = config.vocab_size, config.embed_dim, config.hidden_dim
    params = {
        "embed": jax.random.normal(k_embed, (v, e)) * 0.1,
        "hidden": jax.random.normal(k_hidden, (e, h)) / jnp.sqrt(e),
        "hidden_bias": jnp.zeros((h,)),
        "out": jax.random.normal(k_out, (h, v)) / jnp.sqrt(h),
    }
    return {
        "params": params,
        "opt_state": _optimizer(config).init(params),
        "step": jnp.zeros((), jnp.int32),
        "key": k_state,
    }


def loss_fn(params: dict, batch: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over a ``[batch, seq_len]`` array of byte ids."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    hidden = jnp.tanh(params["embed"][inputs] @ params["hidden"] + params["hidden_bias"])
    logits = hidden @ params["out"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@functools.partial(jax.jit, static_argnames="config")
def train_step(state: dict, batch: jax.Array, config: TinyLMConfig = TinyLMConfig()) -> tuple[dict, dict]:
    """One Adam step; metrics are the loss and the step number."""
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
    updates, opt_state = _optimizer(config).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    # The key is split every step (unused by this deterministic model) so resumption of
    # stateful randomness is exercised too.
    key, _ = jax.random.split(state["key"])
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1, "key": key}
    return new_state, {"loss": loss, "step": new_state["step"]}


# ---- as executor steps: tokenize a corpus with Zephyr, then train on a slice -------------------


@dataclass(frozen=True)
class TokenizeConfig:
    """Tokenize ``texts`` (or the ``"text"`` field of JSONL files matching ``input``) to bytes."""

    output_path: str
    texts: tuple[str, ...] = ()
    input: str | None = None
    num_shards: int = 4


def tokenize_corpus(config: TokenizeConfig) -> dict:
    """A Zephyr pipeline writing a token cache (``part-NNNNN.npy`` + ``ledger.json``, see
    :mod:`marin.tokenize`): each text's bytes then a newline as end-of-document."""
    if config.input:
        dataset = Dataset.from_files(config.input).load_jsonl()
    else:
        texts = list(config.texts)
        shards = [[{"text": t} for t in texts[i :: config.num_shards]] for i in range(config.num_shards)]
        dataset = Dataset.from_list([shard for shard in shards if shard]).flat_map(list)
    pipeline = tokenize_dataset(dataset, config.output_path, tokenizer="byte", eod_token="\n")
    return finish_token_cache(create_backend("sync").execute(pipeline), config.output_path)


@dataclass(frozen=True)
class TrainConfig:
    """Train the tiny model on the token cache ``tokens`` (checkpoints in ``output_path``)."""

    tokens: str
    output_path: str
    tpu_type: str = "v4-8"
    batch_size: int = 8
    seq_len: int = 64
    num_steps: int = 200
    checkpoint_every: int = 50
    seed: int = 0


RESULT_NAME = "result.json"


def train(config: TrainConfig):
    """An ``ExecutorStep`` function: ``train_on_tpu`` with this model; returns the TrainResult
    and writes its summary (final step, metrics, checkpoint path) to ``result.json`` in the
    step's output, so a script can report it also when the step is skipped on a rerun."""
    result = train_on_tpu(
        train_step, init_state, config.tokens,
        tpu_type=config.tpu_type, batch_size=config.batch_size, seq_len=config.seq_len,
        num_steps=config.num_steps, checkpoint_path=f"{config.output_path.rstrip('/')}/checkpoints",
        checkpoint_every=config.checkpoint_every, seed=config.seed,
    )
    summary = {"step": result.step, "metrics": {k: float(v) for k, v in result.metrics.items()},
               "checkpoint_path": result.checkpoint_path, "resumed_from": result.resumed_from}
    with atomic_write(f"{config.output_path.rstrip('/')}/{RESULT_NAME}", "w") as f:
        f.write(json.dumps(summary, indent=2))
    return result


def read_result(output_path: str) -> dict | None:
    """The summary ``train`` wrote in ``output_path``, or None (not trained yet)."""
    fs, path = url_to_fs(f"{output_path.rstrip('/')}/{RESULT_NAME}")
    return json.loads(fs.cat_file(path)) if fs.exists(path) else None
