"""Save on the preemption notice (issue 28): a real subprocess gets a real SIGTERM mid-run.

The interrupted run must exit 143 with a complete checkpoint of the step it was on (not a
multiple of checkpoint_every), and its restart must end with parameters bit-identical to an
uninterrupted run's. JAX runs on the simulated CPU devices of the root conftest's XLA_FLAGS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from marin.training import tiny_lm
from marin.training.checkpoint import latest_step, load_checkpoint
from marin.training.preemption import PREEMPTED_EXIT_CODE
from zephyr import Dataset, create_backend
from zephyr.io.tokens import write_token_ledger

SCRIPT = Path(__file__).parent / "scripts" / "train_until_sigterm.py"
TEXTS = [f"{i}: the quick brown fox jumps over the lazy dog" for i in range(12)]


def _cache(root: str) -> str:
    dataset = Dataset.from_list([TEXTS[:6], TEXTS[6:]]).flat_map(
        lambda texts: [{"input_ids": tiny_lm.encode(t + "\n")} for t in texts])
    paths = list(create_backend("sync").execute(dataset.write_tokens(f"{root}/part-{{shard:05d}}.npy", dtype="uint16")))
    write_token_ledger(paths, f"{root}/ledger.json")
    return root


def _train(cache, checkpoints, num_steps, pause_at, ready) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), cache, checkpoints, str(num_steps), str(pause_at), ready],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))


def _params(checkpoints: str):
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(0))
    return load_checkpoint(checkpoints, template)


def test_sigterm_saves_the_current_step_and_restart_matches_uninterrupted(tmp_path, wait_until):
    cache = _cache(str(tmp_path / "cache"))
    reference = _train(cache, str(tmp_path / "ref"), 12, 0, str(tmp_path / "unused"))
    interrupted_dir, ready = str(tmp_path / "run"), tmp_path / "ready"
    run = _train(cache, interrupted_dir, 12, 7, str(ready))
    try:
        wait_until(lambda: ready.exists() or run.poll() is not None, "the run to reach step 7", timeout=240)
        assert run.poll() is None, run.communicate()[0]
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=240)[0]
    finally:
        run.kill()
    assert run.returncode == PREEMPTED_EXIT_CODE, output
    assert latest_step(interrupted_dir) == 7  # saved at the notice, not at the last multiple of 5
    resumed = _train(cache, interrupted_dir, 12, 0, str(tmp_path / "unused"))
    resumed_output = resumed.communicate(timeout=240)[0]
    assert resumed.returncode == 0, resumed_output
    reference_output = reference.communicate(timeout=240)[0]
    assert reference.returncode == 0, reference_output
    got, want = _params(interrupted_dir), _params(str(tmp_path / "ref"))
    assert got.step == want.step == 12
    assert got.data_position == want.data_position
    leaves = zip(jax.tree_util.tree_leaves(got.state), jax.tree_util.tree_leaves(want.state))
    for a, b in leaves:
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert np.array_equal(np.asarray(a), np.asarray(b))
