"""The training loop on a mesh of 8 simulated CPU devices (no Ray): the batch and the state
are on every device, results match a 1-device run, hosts' rows add up to the global batch,
and bad meshes, batch sizes and checkpoints are refused before any step."""

from __future__ import annotations

import functools
import hashlib
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

from marin.training import DataPosition, TokenBatches, fsdp_sharding, make_mesh, tiny_lm, train_loop  # noqa: E402
from marin.training.checkpoint import load_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow  # each test compiles and trains on 8 devices (seconds apiece)


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
    if jax.device_count() != 8:
        pytest.fail(f"these tests need 8 simulated devices (conftest sets XLA_FLAGS), got {jax.device_count()}")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from zephyr.io import write_jsonl_file

    root = tmp_path_factory.mktemp("tokens")
    text = "a stitch in time saves nine; the early bird catches the worm. " * 20
    for i in range(3):
        records = [{"input_ids": tiny_lm.encode(text[j : j + 29 + 7 * i])} for j in range(0, len(text), 37)]
        write_jsonl_file(records, str(root / f"tok-{i}.jsonl.zst"))
    return str(root / "tok-*.jsonl.zst")


CONFIG = dict(batch_size=8, seq_len=24, num_steps=12, checkpoint_every=5, seed=1, log_every=4)


def one_device_mesh():
    return Mesh(np.array(jax.devices()[:1]), ("data",))


def params_of(path: str, seed: int = 1) -> dict:
    restored = load_checkpoint(path, jax.eval_shape(tiny_lm.init_state, jax.random.key(seed)))
    return jax.tree_util.tree_map(np.asarray, restored.state["params"])


def assert_params_close(a: dict, b: dict) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)


class Recorder:
    """Wraps the model's jitted step and records what the loop hands it."""

    def __init__(self):
        self.batches, self.states = [], []

    def __call__(self, state, batch):
        self.batches.append((type(batch), batch.shape, batch.sharding, [s.data.shape for s in batch.addressable_shards]))
        self.states.append({leaf.sharding for leaf in jax.tree_util.tree_leaves(state)})
        return tiny_lm.train_step(state, batch)


def test_batch_and_state_on_all_devices_and_match_one_device(tokens, tmp_path):
    recorder = Recorder()
    sharded = train_loop(recorder, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "eight"), **CONFIG)
    assert sharded.mesh == {"data": 8} and sharded.step == 12
    kind, shape, sharding, shard_shapes = recorder.batches[0]
    assert issubclass(kind, jax.Array) and shape == (8, 24)
    assert len(sharding.device_set) == 8 and sharding.spec == P("data")
    assert shard_shapes == [(1, 24)] * 8  # one row per device: split along the batch axis
    for shardings in recorder.states:
        assert all(len(s.device_set) == 8 for s in shardings)

    single = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "one"),
                        mesh=one_device_mesh(), **CONFIG)
    assert single.mesh == {"data": 1}
    assert [h["step"] for h in sharded.history] == [h["step"] for h in single.history] == [4, 8, 12]
    np.testing.assert_allclose(sharded.metrics["loss"], single.metrics["loss"], rtol=1e-5)
    assert_params_close(params_of(str(tmp_path / "eight")), params_of(str(tmp_path / "one")))


def test_data_and_model_axes(tokens, tmp_path):
    recorder = Recorder()
    result = train_loop(recorder, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "dm"),
                        mesh_shape=(4, 2), axis_names=("data", "model"), **CONFIG)
    assert result.mesh == {"data": 4, "model": 2}
    _, _, sharding, shard_shapes = recorder.batches[0]
    assert sharding.spec == P("data") and shard_shapes == [(2, 24)] * 8  # replicated along "model"
    reference = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "one"),
                           mesh=one_device_mesh(), **CONFIG)
    np.testing.assert_allclose(result.metrics["loss"], reference.metrics["loss"], rtol=1e-5)


def test_fsdp_state_sharding_keeps_params_sharded(tokens, tmp_path):
    recorder = Recorder()
    train_loop(recorder, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "fsdp"),
               state_sharding=fsdp_sharding(min_size=256), **CONFIG)
    restored = load_checkpoint(str(tmp_path / "fsdp"), jax.eval_shape(tiny_lm.init_state, jax.random.key(1)))
    # the state the first and the last step received: the embedding (256 x 32) is split 8 ways
    # along its rows, the output layer (64 x 256) along its columns, small leaves replicated
    for shardings in (recorder.states[0], recorder.states[-1]):
        assert {s.spec for s in shardings} == {P("data"), P(None, "data"), P()}
    reference = train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "rep"),
                           **CONFIG)
    assert_params_close(jax.tree_util.tree_map(np.asarray, restored.state["params"]),
                        params_of(reference.checkpoint_path))


def test_state_sharding_as_a_prefix_tree_of_specs(tokens, tmp_path):
    specs = {"params": {"embed": P("data", None), "hidden": P(), "hidden_bias": P(), "out": P(None, "data")},
             "opt_state": P(), "step": P(), "key": P()}
    recorder = Recorder()
    train_loop(recorder, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "specs"),
               state_sharding=specs, **{**CONFIG, "num_steps": 2})
    assert {s.spec for s in recorder.states[0]} >= {P("data", None), P(None, "data")}
    with pytest.raises(ValueError, match="state_sharding does not match the structure"):
        train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, checkpoint_path=str(tmp_path / "bad"),
                   state_sharding={"params": P()}, **CONFIG)


def test_hosts_rows_add_up_to_the_one_host_batches(tokens):
    from marin.training import resolve_shards

    shards = resolve_shards(tokens)
    whole = TokenBatches(shards, batch_size=8, seq_len=10)
    expected = [next(whole) for _ in range(6)]
    for hosts in (2, 4):
        per_host = 8 // hosts
        readers = [TokenBatches(shards, batch_size=8, seq_len=10, rows=[(h * per_host, (h + 1) * per_host)])
                   for h in range(hosts)]
        for batch in expected:
            parts = [next(r) for r in readers]
            np.testing.assert_array_equal(np.concatenate(parts), batch)
            assert len({r.position for r in readers}) == 1  # one position resumes every host
        # host 1 resumes from the shared position and continues on its own rows
        resumed = TokenBatches(shards, batch_size=8, seq_len=10, position=readers[1].position,
                               rows=[(per_host, 2 * per_host)])
        np.testing.assert_array_equal(next(resumed), next(whole)[per_host : 2 * per_host])
        whole = TokenBatches(shards, batch_size=8, seq_len=10)
        [next(whole) for _ in range(6)]
    with pytest.raises(ValueError, match="rows must be sorted"):
        TokenBatches(shards, batch_size=8, seq_len=10, rows=[(4, 9)])


def test_position_is_global_across_row_subsets(tokens):
    from marin.training import resolve_shards

    shards = resolve_shards(tokens)
    a = TokenBatches(shards, batch_size=4, seq_len=16, rows=[(0, 1)])
    b = TokenBatches(shards, batch_size=4, seq_len=16)
    for _ in range(5):
        next(a), next(b)
    assert a.position == b.position != DataPosition()


def checkpoint_fingerprint(path) -> dict:
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                files[os.path.relpath(os.path.join(root, name), path)] = hashlib.sha256(f.read()).hexdigest()
    return files


def test_bad_input_fails_before_any_step_and_damages_nothing(tokens, tmp_path):
    calls = []

    def step(state, batch):
        calls.append(1)
        return tiny_lm.train_step(state, batch)

    ckpt = tmp_path / "ckpt"
    with pytest.raises(ValueError, match="batch_size 6 is not divisible by the 8 devices of the mesh's 'data' axis"):
        train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), **{**CONFIG, "batch_size": 6})
    with pytest.raises(ValueError, match=r"mesh_shape \(3, 2\) has 6 devices but this run has 8"):
        train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), mesh_shape=(3, 2),
                   axis_names=("data", "model"), **CONFIG)
    with pytest.raises(ValueError, match="axis_names must include 'data'"):
        train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), axis_names=("batch",), **CONFIG)
    assert not calls and not ckpt.exists()

    # A checkpoint of another model: refused by name, and left exactly as it was.
    train_loop(tiny_lm.train_step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), **{**CONFIG, "num_steps": 5})
    before = checkpoint_fingerprint(ckpt)
    wider = functools.partial(tiny_lm.init_state, config=tiny_lm.TinyLMConfig(hidden_dim=96))
    wider_step = functools.partial(tiny_lm.train_step, config=tiny_lm.TinyLMConfig(hidden_dim=96))
    with pytest.raises(ValueError, match=r"ckpt/5: .*different model.*mu\.hidden is float32\[32, 64\] in the "
                                         r"checkpoint but float32\[32, 96\] in the state.*; \.\.\. 3 more"):
        train_loop(wider_step, wider, tokens, checkpoint_path=str(ckpt), **CONFIG)
    with pytest.raises(ValueError, match="missing from the checkpoint: extra"):
        train_loop(step, lambda key: {**tiny_lm.init_state(key), "extra": jax.numpy.zeros(3)}, tokens,
                   checkpoint_path=str(ckpt), **CONFIG)
    # The same model on other data: the saved position would point into other shards.
    with pytest.raises(ValueError, match=r"other data than this run's \(num_shards 3 -> 2; shard_names_sha256"):
        train_loop(step, tiny_lm.init_state, tokens.replace("tok-*", "tok-[01]"), checkpoint_path=str(ckpt), **CONFIG)
    with pytest.raises(ValueError, match=r"seq_len 24 -> 32"):
        train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), **{**CONFIG, "seq_len": 32})
    # A checkpoint past num_steps (another run's folder, or a smaller total by mistake).
    with pytest.raises(ValueError, match=r"ckpt is at step 5, past num_steps=3"):
        train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt), **{**CONFIG, "num_steps": 3})
    assert train_loop(step, tiny_lm.init_state, tokens, checkpoint_path=str(ckpt),
                      **{**CONFIG, "num_steps": 5}).step == 5  # at num_steps: done, nothing to run
    assert not calls
    assert checkpoint_fingerprint(ckpt) == before


def test_resuming_on_rewritten_shards_of_the_same_names_is_refused(tmp_path):
    """Regression: the resume guard hashed only the shards' names (no folders), so a checkpoint
    made on `v1/tok-*.jsonl` resumed on `v2/tok-*.jsonl`, shards of the same names holding other
    tokens, and the saved position pointed into them. A copy of the same shards still resumes."""
    import shutil

    from zephyr.io import write_jsonl_file

    for version, step in (("v1", 7), ("v2", 11)):  # v2: as if re-tokenized, other ids and lengths
        (tmp_path / version).mkdir()
        for i in range(2):
            write_jsonl_file([{"input_ids": [(step * k + j) % 256 for k in range(40 + j * step)]} for j in range(5)],
                             str(tmp_path / version / f"tok-{i}.jsonl"))
    shutil.copytree(tmp_path / "v1", tmp_path / "copy")

    def run(version, steps):
        return train_loop(tiny_lm.train_step, tiny_lm.init_state, str(tmp_path / version / "tok-*.jsonl"),
                          batch_size=8, seq_len=8, num_steps=steps, checkpoint_path=str(tmp_path / "ckpt"),
                          checkpoint_every=2)

    run("v1", 2)
    with pytest.raises(ValueError, match=r"other data than this run's \(shard_sizes_sha256"):
        run("v2", 4)
    assert run("copy", 4).resumed_from == 2
