"""Orbax checkpoints of the training loop (8 simulated CPU devices, no Ray): sharded
round trips onto other meshes, the last N kept, asynchronous saves, half-written
checkpoints never restored (fabricated, and a training process killed mid-save), resume to
identical parameters, ``gs://`` on the local GCS emulator, dtypes, and the old format refused."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from marin.training import Checkpointer, DataPosition, latest_step, load_checkpoint, save_checkpoint, tiny_lm, train_loop  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "train_tiny_lm.py")
TMP_SUFFIX = ".orbax-checkpoint-tmp"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from zephyr.io import write_jsonl_file

    root = tmp_path_factory.mktemp("tokens")
    text = "a stitch in time saves nine; " * 30
    for i in range(2):
        records = [{"input_ids": tiny_lm.encode(text[j : j + 33 + i])} for j in range(0, len(text), 41)]
        write_jsonl_file(records, str(root / f"tok-{i}.jsonl.zst"))
    return str(root / "tok-*.jsonl.zst")


def sharded_state():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    w = jax.device_put(np.arange(64.0, dtype=np.float32).reshape(16, 4), NamedSharding(mesh, P("data")))
    return {"w": w, "n": jax.numpy.int32(4), "key": jax.random.key(1), "b": jax.numpy.ones(3, jax.numpy.bfloat16)}


def test_round_trip_keeps_the_last_n_and_restores_onto_another_mesh(tmp_path):
    state, directory = sharded_state(), str(tmp_path / "ckpt")
    assert load_checkpoint(directory, state) is None and latest_step(directory) is None
    for step in (1, 2, 3):
        save_checkpoint(directory, step, state, DataPosition(0, 1, 2, step), metrics={"loss": 0.5}, keep=2,
                        history=[{"step": step, "loss": 0.5}])
    assert sorted(os.listdir(directory)) == ["2", "3"] and latest_step(directory) == 3
    # Restore onto 4 of the 8 devices, split the other way: arrays land with the asked sharding.
    mesh4 = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    target["w"] = jax.ShapeDtypeStruct((16, 4), np.float32, sharding=NamedSharding(mesh4, P("model", "data")))
    loaded = load_checkpoint(directory, target)
    assert loaded.step == 3 and loaded.data_position == DataPosition(0, 1, 2, 3) and loaded.metrics == {"loss": 0.5}
    assert loaded.history == [{"step": 3, "loss": 0.5}] and loaded.path.endswith("ckpt/3")
    assert loaded.state["w"].sharding.spec == P("model", "data") and len(loaded.state["w"].sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(loaded.state["w"]), np.arange(64.0).reshape(16, 4))
    np.testing.assert_array_equal(jax.random.key_data(loaded.state["key"]), jax.random.key_data(state["key"]))
    assert loaded.state["b"].dtype == jax.numpy.bfloat16 and int(loaded.state["n"]) == 4
    assert len(load_checkpoint(directory, state, step=2).state["w"].sharding.device_set) == 8


def test_python_scalar_leaves_restore_with_the_template_dtype(tmp_path):
    def init(key):
        return {"w": jax.random.normal(key, (3,), dtype=jax.numpy.bfloat16), "lr": 0.125, "count": 7}

    key, directory = jax.random.key(0), str(tmp_path / "ckpt")
    save_checkpoint(directory, 4, init(key), DataPosition())
    loaded = load_checkpoint(directory, jax.eval_shape(init, key))
    assert float(loaded.state["lr"]) == 0.125 and int(loaded.state["count"]) == 7
    assert loaded.state["lr"].dtype == np.float32 and loaded.state["count"].dtype == np.int32


def test_a_half_written_checkpoint_is_never_restored_and_is_cleaned_up(tmp_path):
    state, directory = sharded_state(), tmp_path / "ckpt"
    save_checkpoint(str(directory), 5, state, DataPosition(token=5))
    # What a host preempted mid-save leaves: step 10's temporary directory, truncated.
    partial = directory / f"10{TMP_SUFFIX}"
    shutil.copytree(directory / "5", partial)
    for marker in glob.glob(str(partial / "**" / "commit_success.txt"), recursive=True):
        os.remove(marker)  # an unfinished save has no completion markers yet
    truncated = 0
    for path in glob.glob(str(partial / "state" / "**" / "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "r+b") as f:
                f.truncate(max(0, os.path.getsize(path) // 2))
            truncated += 1
    assert truncated
    assert latest_step(str(directory)) == 5
    assert load_checkpoint(str(directory), state).data_position == DataPosition(token=5)
    # readers leave it alone: it could be a live run's save in progress
    assert sorted(os.listdir(directory)) == ["10.orbax-checkpoint-tmp", "5"]
    with Checkpointer(str(directory)) as checkpoints:  # the next run's writer removes the leftover
        assert checkpoints.latest_step() == 5
        checkpoints.save(6, state, DataPosition(token=6))
        checkpoints.wait()
    assert sorted(os.listdir(directory)) == ["5", "6"]


@pytest.mark.slow
def test_saves_are_asynchronous(tokens, tmp_path):
    """Training goes on while a checkpoint is being written: some step starts while a
    temporary (unfinished) checkpoint directory exists."""
    ckpt = tmp_path / "ckpt"
    config = tiny_lm.TinyLMConfig(embed_dim=256, hidden_dim=1024)  # ~7 MB of state per save
    seen_during_save = []

    def step(state, batch):
        if any(name.endswith(TMP_SUFFIX) for name in os.listdir(ckpt)):
            seen_during_save.append(len(seen_during_save))
        return tiny_lm.train_step(state, batch, config=config)

    result = train_loop(step, functools.partial(tiny_lm.init_state, config=config), tokens, batch_size=8, seq_len=24,
                        num_steps=24, checkpoint_every=4, checkpoint_path=str(ckpt), seed=1)
    assert result.step == 24 and sorted(os.listdir(ckpt)) == ["20", "24"]
    assert seen_during_save, "no step ran while a checkpoint was being written"


def run_script(*args, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def output_of(process: subprocess.Popen) -> str:
    try:
        return process.communicate(timeout=30)[0][-4000:]
    except subprocess.TimeoutExpired:
        return "(no output)"


@pytest.mark.slow
def test_killed_during_an_async_save_resumes_to_the_uninterrupted_result(tokens, tmp_path):
    """A training process killed while a save is being written resumes from the last complete
    checkpoint to the parameters of an uninterrupted run (here, in this process: same loop)."""
    ckpt, steps, model = str(tmp_path / "ckpt"), 25, dict(embed_dim=256, hidden_dim=1024)  # ~7 MB a save
    args = ["--data", tokens, "--embed", str(model["embed_dim"]), "--hidden", str(model["hidden_dim"]),
            "--ckpt", ckpt, "--steps", str(steps), "--checkpoint-every", "5"]
    process = run_script(*args)
    try:
        deadline, partial = time.monotonic() + 300, None
        while partial is None:
            if process.poll() is not None:
                pytest.fail(f"training ended before it was killed:\n{output_of(process)}")
            if time.monotonic() > deadline:
                pytest.fail(f"no checkpoint save was seen in progress within 300 s:\n{os.listdir(ckpt)}")
            names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
            partial = next((n for n in names if n.endswith(TMP_SUFFIX) and int(n.split(".")[0]) >= 15), None)
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)  # preempted while step `partial` is being written
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    unfinished = [n for n in os.listdir(ckpt) if n.endswith(TMP_SUFFIX)]
    committed = latest_step(ckpt)
    assert committed is not None and committed < steps
    for name in unfinished:  # the save cut short is never the one restored
        assert committed < int(name.split(".")[0])

    resumed = run_script(*args, "--result", str(tmp_path / "resumed.json"))
    assert resumed.wait(timeout=300) == 0, output_of(resumed)
    config = tiny_lm.TinyLMConfig(**model)  # the script's defaults otherwise: batch 8, sequences of 24, seed 1
    train_loop(functools.partial(tiny_lm.train_step, config=config), functools.partial(tiny_lm.init_state, config=config),
               tokens, batch_size=8, seq_len=24, num_steps=steps, checkpoint_path=str(tmp_path / "straight"),
               checkpoint_every=5, seed=1)
    template = jax.eval_shape(functools.partial(tiny_lm.init_state, config=config), jax.random.key(1))
    a, b = load_checkpoint(ckpt, template), load_checkpoint(str(tmp_path / "straight"), template)
    assert a.step == b.step == steps and a.data_position == b.data_position
    for x, y in zip(jax.tree_util.tree_leaves(a.state["params"]), jax.tree_util.tree_leaves(b.state["params"]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_train_loop_resumes_to_identical_params(tokens, tmp_path):
    config = dict(batch_size=8, seq_len=24, checkpoint_every=4, seed=1)
    straight = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=30,
                          checkpoint_path=str(tmp_path / "a"), **config)
    # An "interrupted" run: stops at step 13, then a new call continues to 30.
    train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=13,
               checkpoint_path=str(tmp_path / "b"), **config)
    resumed = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=30,
                         checkpoint_path=str(tmp_path / "b"), **config)
    assert resumed.resumed_from == 13 and resumed.step == straight.step == 30
    assert straight.metrics["loss"] < 4.0  # learned something from log(256) = 5.5
    # the metrics history (the loss curve) survives the interruption: the straight run's points,
    # plus the one the shortened first call logged as its last step
    assert [h["step"] for h in straight.history] == [10, 20, 30]
    assert [h for h in resumed.history if h["step"] != 13] == straight.history
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(1))
    a, b = load_checkpoint(str(tmp_path / "a"), template), load_checkpoint(str(tmp_path / "b"), template)
    assert a.data_position == b.data_position
    for x, y in zip(jax.tree_util.tree_leaves(a.state["params"]), jax.tree_util.tree_leaves(b.state["params"]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # Already finished: a rerun trains nothing and keeps the result.
    again = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=30,
                       checkpoint_path=str(tmp_path / "b"), **config)
    assert again.resumed_from == 30 and again.step == 30


@pytest.mark.slow
def test_checkpoints_on_gcs(tokens, gcs_bucket, tmp_path):
    """gs:// through the local GCS emulator: gcsfs for directories, tensorstore for arrays."""
    import fsspec

    directory = f"{gcs_bucket}/run/checkpoints"
    config = dict(batch_size=8, seq_len=24, checkpoint_every=4, seed=1)
    train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=6, checkpoint_path=directory, **config)
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    names = sorted(path.rsplit("/", 1)[-1] for path in fs.ls(directory.removeprefix("gs://")))
    assert names == ["4", "6"] and latest_step(directory) == 6
    assert fs.exists(f"{directory}/6/commit_success.txt")
    # On an object store a step counts only with its commit marker: one without it is ignored.
    fs.copy(f"{directory}/6", f"{directory}/8", recursive=True)
    fs.rm(f"{directory}/8/commit_success.txt")
    fs.invalidate_cache()
    assert latest_step(directory) == 6
    resumed = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=12, checkpoint_path=directory,
                         **config)
    assert resumed.resumed_from == 6 and resumed.step == 12
    local = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, num_steps=12,
                       checkpoint_path=str(tmp_path / "local"), **config)
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(1))
    a, b = load_checkpoint(directory, template), load_checkpoint(local.checkpoint_path, template)
    for x, y in zip(jax.tree_util.tree_leaves(a.state), jax.tree_util.tree_leaves(b.state), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_earlier_npz_format_is_refused_with_guidance(tmp_path, tokens):
    directory = tmp_path / "old"
    directory.mkdir()
    (directory / "latest.json").write_text('{"step": 200, "file": "step-00000200.npz"}')
    (directory / "step-00000200.npz").write_bytes(b"old")
    with pytest.raises(ValueError, match="earlier .npz format.*new directory"):
        train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, batch_size=8, seq_len=24, num_steps=2,
                   checkpoint_path=str(directory))
    assert sorted(os.listdir(directory)) == ["latest.json", "step-00000200.npz"]
