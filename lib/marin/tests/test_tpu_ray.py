"""marin.tpu on a simulated multi-node TPU cluster (conftest's LocalRayCluster over ray.cluster_utils.Cluster, JAX on CPU).

Worker nodes carry the resources and labels Ray gives real TPU VMs: two v4-8 hosts
(``TPU: 4`` + ``TPU-v4-8-head``) and one v4-16 slice of two hosts that share the slice-name
resource, the head resource on host 0 only. Each host's JAX sees 4 simulated CPU devices
(its 4 chips). Node loss is a real `remove_node(..., allow_graceful=False)`. One cluster
serves the whole module.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from jax.sharding import Mesh

ray = pytest.importorskip("ray")
jax = pytest.importorskip("jax")

from ray import cloudpickle  # noqa: E402

from marin.tpu import (  # noqa: E402
    TpuPreemptedError,
    TpuSetupError,
    latest_step,
    load_checkpoint,
    run_on_tpu,
    tpu_resources,
    train_loop,
    train_on_tpu,
)
from marin.training import tiny_lm  # noqa: E402
from marin.tpu.runner import SLICE_NAME_LABEL  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# Test helpers below run in Ray workers, which cannot import this file by module name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

V4_8 = {"TPU": 4, "TPU-v4-8-head": 1}
SLICE = "sim-v4-16-slice"
FAST_FAILURE_DETECTION = {
    "health_check_period_ms": 300,
    "health_check_failure_threshold": 2,
    "health_check_timeout_ms": 300,
    "health_check_initial_delay_ms": 0,
}
CHIPS_PER_HOST = 4


@dataclass
class SimCluster:
    cluster: Any  # conftest's LocalRayCluster: free ports, retried node starts, no trace left
    v4_8: dict = field(default_factory=dict)  # node id -> Node
    v4_16: dict = field(default_factory=dict)
    lockfile: str = ""

    def add_v4_8(self):
        node = self.cluster.add_node(num_cpus=1, resources=V4_8)
        self.v4_8[node.node_id] = node
        return node

    def kill(self, node_id: str) -> None:
        node = self.v4_8.pop(node_id)
        self.cluster.kill(node)

    def add_v4_16_host(self, head: bool):
        resources = {"TPU": CHIPS_PER_HOST, SLICE: 1, **({"TPU-v4-16-head": 1} if head else {})}
        node = self.cluster.add_node(num_cpus=1, resources=resources, labels={SLICE_NAME_LABEL: SLICE})
        self.v4_16[node.node_id] = node
        return node

    def kill_v4_16_host(self, node_id: str) -> None:
        self.cluster.kill(self.v4_16.pop(node_id))


@pytest.fixture(scope="module")
def sim(tmp_path_factory, ray_cluster_module):
    # The head (the driver's node) poses as host 0 of a v4-32 slice without a slice name.
    local = ray_cluster_module(num_cpus=1, _system_config=FAST_FAILURE_DETECTION, resources={"TPU": 4, "TPU-v4-32-head": 1})
    sim = SimCluster(local, lockfile=str(tmp_path_factory.mktemp("lock") / "libtpu_lockfile"))
    try:
        for _ in range(2):
            sim.add_v4_8()
        for host in range(2):
            sim.add_v4_16_host(head=host == 0)
        env = {"JAX_PLATFORMS": "cpu", "MARIN_LIBTPU_LOCKFILE": sim.lockfile, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={CHIPS_PER_HOST}"}
        os.environ["MARIN_LIBTPU_LOCKFILE"] = sim.lockfile
        local.connect(runtime_env={"env_vars": env})
        yield sim
    finally:
        os.environ.pop("MARIN_LIBTPU_LOCKFILE", None)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def preemptions(caplog) -> int:
    """How many times run_on_tpu restarted after losing a host (its warnings, in this process)."""
    return sum("host lost (preemption" in record.getMessage() for record in caplog.records)



# ---- functions that run on the simulated hosts -------------------------------------------


def where_am_i():
    """Node id, the host/slice env run_on_tpu set, and whether the lockfile existed."""
    lockfile = os.environ["MARIN_LIBTPU_LOCKFILE"]
    open(lockfile, "w").close()  # as libtpu would
    keys = ("MARIN_TPU_HOST_ID", "MARIN_TPU_NUM_HOSTS", "MARIN_TPU_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS",
            "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT")
    return ray.get_runtime_context().get_node_id(), {k: os.environ.get(k) for k in keys}


def _count_attempt(counter_dir: str) -> int:
    """Record one attempt in a shared directory; return how many came before it."""
    before = len(os.listdir(counter_dir))
    open(os.path.join(counter_dir, f"attempt-{time.time_ns()}"), "w").close()
    return before


def user_bug(counter_dir: str):
    _count_attempt(counter_dir)
    raise ValueError("boom: a bug in user code")


def crash_worker_then_succeed(counter_dir: str, crashes: int):
    if _count_attempt(counter_dir) < crashes:
        os._exit(1)  # the worker process dies, as on a lost host
    return "done"


def fail_on_slice_0_else_heartbeat(directory: str):
    """Slice 0 fails at once; slice 1 touches a heartbeat file for two minutes, then finishes."""
    if os.environ["MARIN_TPU_SLICE_ID"] == "0":
        deadline = time.monotonic() + 120  # fail only once slice 1 is surely running
        while not os.path.exists(os.path.join(directory, "slice-1-heartbeat")) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("slice 0 broke")
    for _ in range(600):
        with open(os.path.join(directory, "slice-1-heartbeat"), "w") as f:
            f.write(str(time.time()))
        time.sleep(0.2)
    open(os.path.join(directory, "slice-1-finished"), "w").close()


def joint_sum():
    """What one host of a multi-host JAX program sees, and a sum over every process's devices."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    local = np.full((jax.local_device_count(),), jax.process_index() + 1, np.float32)
    array = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local, (jax.device_count(),))
    total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P()))(array)
    return (jax.process_count(), jax.process_index(), jax.device_count(), jax.local_device_count(),
            float(total.addressable_data(0)), ray.get_runtime_context().get_node_id())


def slow_step(marker: str, state, batch):
    """tiny_lm's step, slowed so the test can kill the node mid-run; records the node it runs
    on (host 1's on a multi-host slice)."""
    node = ray.get_runtime_context().get_node_id()
    if os.environ.get("MARIN_TPU_NUM_HOSTS", "1") == "1" or os.environ.get("MARIN_TPU_HOST_ID") == "1":
        if _read(marker + ".node") != node:
            with open(marker + ".node", "w") as f:
                f.write(node)
    time.sleep(0.04)
    return tiny_lm.train_step(state, batch)


# ---- tests ---------------------------------------------------------------------------------


def test_task_asking_for_v4_8_lands_on_a_v4_8_head(sim):
    @ray.remote
    def node_id():
        return ray.get_runtime_context().get_node_id()

    placed = ray.get([node_id.options(**tpu_resources("v4-8")).remote() for _ in range(4)])
    assert set(placed) <= set(sim.v4_8)
    slice_head = ray.get(node_id.options(**tpu_resources("v4-16")).remote())
    host0 = [nid for nid, node in sim.v4_16.items() if "TPU-v4-16-head" in _node_resources(nid)]
    assert slice_head in host0


def _node_resources(node_id):
    return next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id)


def test_run_on_single_host_slice_cleans_lockfile(sim):
    [(node_id, env)] = run_on_tpu(where_am_i, "v4-8", fresh_process=False)
    assert node_id in sim.v4_8
    assert env["MARIN_TPU_HOST_ID"] == "0" and env["MARIN_TPU_NUM_HOSTS"] == "1"
    assert env["MEGASCALE_NUM_SLICES"] is None  # single slice: no multislice variables
    assert not os.path.exists(sim.lockfile)


def test_multi_host_slice_runs_fn_once_per_host(sim):
    results = run_on_tpu(where_am_i, "v4-16", fresh_process=False)
    assert sorted(node for node, _ in results) == sorted(sim.v4_16)
    assert sorted(env["MARIN_TPU_HOST_ID"] for _, env in results) == ["0", "1"]
    assert {env["MARIN_TPU_NUM_HOSTS"] for _, env in results} == {"2"}
    assert not os.path.exists(sim.lockfile)


def test_multi_host_slice_without_a_slice_name_fails_fast(sim):
    with pytest.raises(TpuSetupError, match="v4-32 slice .* has no slice name"):
        run_on_tpu(where_am_i, "v4-32", max_retries_failure=5, fresh_process=False)


def test_multislice_sets_megascale_env(sim):
    results = run_on_tpu(where_am_i, "v4-8", num_slices=2, fresh_process=False)
    assert sorted(node for node, _ in results) == sorted(sim.v4_8)
    envs = [env for _, env in results]
    assert [env["MEGASCALE_SLICE_ID"] for env in envs] == ["0", "1"]
    assert {env["MEGASCALE_NUM_SLICES"] for env in envs} == {"2"}
    assert len({env["MEGASCALE_COORDINATOR_ADDRESS"] for env in envs}) == 1
    assert {env["MEGASCALE_PORT"] for env in envs} == {"8081"}


def test_a_failing_slice_stops_the_others(sim, tmp_path, wait_until):
    directory = str(tmp_path)
    with pytest.raises(RuntimeError, match="slice 0 broke"):
        run_on_tpu(lambda: fail_on_slice_0_else_heartbeat(directory), "v4-8", num_slices=2, max_retries_failure=0)
    beat = tmp_path / "slice-1-heartbeat"

    assert beat.exists()  # slice 0 failed while slice 1 was running

    def stopped():  # slice 1's heartbeat went quiet: it was killed
        return time.time() - beat.stat().st_mtime > 5

    wait_until(stopped, "slice 1's fn to be stopped after slice 0 failed")
    assert not (tmp_path / "slice-1-finished").exists()


def test_user_exception_exhausts_failure_budget_with_traceback(sim, tmp_path):
    with pytest.raises(ValueError, match="boom: a bug in user code") as info:
        run_on_tpu(lambda: user_bug(str(tmp_path)), "v4-8", max_retries_failure=2, fresh_process=False)
    assert len(os.listdir(tmp_path)) == 3  # the first try plus two retries
    message = str(info.value)
    # The remote traceback: the frame of fn that raised, and the raising line.
    assert "in user_bug" in message and 'raise ValueError("boom' in message
    assert any("max_retries_failure=2" in note for note in info.value.__notes__)


def test_worker_loss_is_retried_without_using_failure_budget(sim, tmp_path, caplog):
    counter = str(tmp_path)
    caplog.set_level("WARNING", logger="marin.tpu.runner")
    result = run_on_tpu(lambda: crash_worker_then_succeed(counter, 2), "v4-8", max_retries_failure=0)
    assert result == ["done"] and len(os.listdir(tmp_path)) == 3  # two attempts crashed, the third finished
    assert preemptions(caplog) == 2  # both crashes were lost attempts, not failures


def test_a_run_waits_for_its_slice_with_warnings_and_starts_when_one_appears(sim, monkeypatch, caplog, wait_until):
    """No free v6e-4 in the cluster: run_on_tpu waits (the autoscaler's job) and says so
    every SLICE_WAIT_WARNING_INTERVAL; once a v6e-4 host joins, the run lands there."""
    from marin.tpu import runner

    monkeypatch.setattr(runner, "SLICE_WAIT_WARNING_INTERVAL", 0.5)
    outcome = {}

    def run():
        try:
            outcome["result"] = run_on_tpu(where_am_i, "v6e-4", fresh_process=False)
        except BaseException as e:  # surfaced by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)  # never blocks the test run's exit
    node = None
    with caplog.at_level("WARNING", logger=runner.__name__):
        thread.start()
        try:
            wait_until(lambda: any("'TPU-v6e-4-head'" in r.getMessage() for r in caplog.records),
                       "a warning naming the missing v6e-4 head resource")
            assert thread.is_alive() and not outcome
            node = sim.cluster.add_node(num_cpus=1, resources={"TPU": 4, "TPU-v6e-4-head": 1})
        finally:
            thread.join(timeout=300)
    try:
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        [(node_id, env)] = outcome["result"]
        assert node_id == node.node_id and env["MARIN_TPU_NUM_HOSTS"] == "1"
        message = next(r.getMessage() for r in caplog.records if "'TPU-v6e-4-head'" in r.getMessage())
        assert message.startswith("v6e-4 x1: waited ") and "ray status" in message
    finally:
        if node is not None:
            sim.cluster.kill(node)


def test_preemption_budget_is_bounded(sim, tmp_path):
    counter = str(tmp_path)
    with pytest.raises(TpuPreemptedError, match="max_retries_preemption=0"):
        run_on_tpu(lambda: crash_worker_then_succeed(counter, 99), "v4-8", max_retries_preemption=0)
    assert len(os.listdir(tmp_path)) == 1


@pytest.fixture(scope="module")
def token_shards(tmp_path_factory):
    """A small byte-tokenized corpus written by a Zephyr pipeline (a token cache: part-NNNNN.npy + ledger)."""
    root = str(tmp_path_factory.mktemp("tokens"))
    texts = tuple(f"{i}: it was the best of times, it was the worst of times" for i in range(40))
    tiny_lm.tokenize_corpus(tiny_lm.TokenizeConfig(output_path=root, texts=texts, num_shards=3))
    assert len([name for name in os.listdir(root) if name.startswith("part-") and ".offsets" not in name]) == 3
    return root


def test_training_survives_repeated_node_kills_and_matches_uninterrupted_run(sim, token_shards, tmp_path, wait_until,
                                                                            caplog):
    config = dict(batch_size=4, seq_len=32, num_steps=60, checkpoint_every=5, seed=3)
    ckpt, marker = str(tmp_path / "ckpt"), str(tmp_path / "marker")
    outcome = {}

    def train():
        try:
            outcome["result"] = train_on_tpu(
                lambda s, b: slow_step(marker, s, b), tiny_lm.init_state, token_shards, tpu_type="v4-8",
                checkpoint_path=ckpt, max_retries_failure=0, **config,
            )
        except BaseException as e:  # surfaced by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=train)
    caplog.set_level("WARNING", logger="marin.tpu.runner")
    thread.start()
    killed = []
    for kill_after_step in (10, 30):
        def reached(step=kill_after_step):
            return (latest_step(ckpt) or 0) >= step and _read(marker + ".node")

        node = wait_until(reached, f"a checkpoint at step >= {kill_after_step}")
        assert latest_step(ckpt) < config["num_steps"], "training finished before the node was killed"
        sim.kill(node)
        assert thread.is_alive(), "training finished before the node was killed"
        os.remove(marker + ".node")
        killed.append(node)
        sim.add_v4_8()  # the autoscaler's replacement
    thread.join(timeout=400)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.step == config["num_steps"] and result.resumed_from is not None
    # both kills landed: each cost the run an attempt (a restart may also land on a node Ray
    # has not yet seen die, and be lost once more)
    assert preemptions(caplog) >= 2

    # the uninterrupted run, on a mesh of 4 devices like the simulated v4-8 host's
    reference = train_loop(tiny_lm.train_step, tiny_lm.init_state, token_shards,
                           checkpoint_path=str(tmp_path / "reference"), mesh=_mesh(CHIPS_PER_HOST), **config)
    assert result.mesh == reference.mesh == {"data": CHIPS_PER_HOST}
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(config["seed"]))
    resumed, uninterrupted = load_checkpoint(ckpt, template), load_checkpoint(reference.checkpoint_path, template)
    assert resumed.data_position == uninterrupted.data_position
    for a, b in zip(jax.tree_util.tree_leaves(resumed.state["params"]),
                    jax.tree_util.tree_leaves(uninterrupted.state["params"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _mesh(devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:devices]), ("data",))


def test_run_on_tpu_joins_the_hosts_of_a_slice_into_one_jax_program(sim):
    results = run_on_tpu(joint_sum, "v4-16")
    assert sorted(node for *_, node in results) == sorted(sim.v4_16)
    assert sorted(index for _, index, *_ in results) == [0, 1]
    for count, _, devices, local, total, _ in results:
        # 2 processes x 4 devices, one program: the sum covers both hosts' devices (4 x 1 + 4 x 2)
        assert (count, devices, local, total) == (2, 2 * CHIPS_PER_HOST, CHIPS_PER_HOST, 12.0)
    # opting out: each host runs JAX on its own
    alone = run_on_tpu(joint_sum, "v4-16", jax_distributed=False)
    assert {(count, devices, total) for count, _, devices, _, total, _ in alone} == {(1, CHIPS_PER_HOST, 4.0)}


def test_training_runs_as_an_executor_step(sim, tmp_path):
    execution = pytest.importorskip("marin.execution")
    ExecutorStep, executor_main = execution.ExecutorStep, execution.executor_main
    tokens = ExecutorStep(
        name="tiny/tokens", fn=tiny_lm.tokenize_corpus,
        config=tiny_lm.TokenizeConfig(output_path=execution.this_output_path(),
                                      texts=tuple(f"line {i}: hello tpu" for i in range(30)), num_shards=2),
    )
    train = ExecutorStep(
        name="tiny/train", fn=tiny_lm.train,
        config=tiny_lm.TrainConfig(tokens=execution.output_path_of(tokens), output_path=execution.this_output_path(),
                                   tpu_type="v4-8", batch_size=4, seq_len=16, num_steps=12, checkpoint_every=5),
    )
    config = execution.ExecutorMainConfig(prefix=str(tmp_path), poll_interval=0.2, heartbeat_interval=1.0)
    first = executor_main([tokens, train], config=config)
    assert set(first.values()) == {"SUCCESS"}
    (train_dir,) = (tmp_path / "tiny").glob("train-*")
    assert latest_step(str(train_dir / "checkpoints")) == 12
    assert set(executor_main([tokens, train], config=config).values()) == {"SKIPPED"}


def test_multi_host_training_survives_losing_a_host(sim, token_shards, tmp_path, wait_until, caplog):
    """A v4-16 host dies mid-run: the whole slice restarts (a replacement host joins), the two
    hosts form a new JAX program over every chip of both, restore the last complete checkpoint
    onto the mesh, and end with the parameters and loss of an uninterrupted 8-device run in this
    process. It is also the test of training on every chip of a multi-host slice: each attempt is
    such a run."""
    config = dict(batch_size=8, seq_len=16, num_steps=30, checkpoint_every=5, seed=4)  # killed at >= 10: 20 steps to go
    ckpt, marker = str(tmp_path / "ckpt"), str(tmp_path / "marker")
    outcome = {}

    def train():
        try:
            outcome["result"] = train_on_tpu(
                lambda s, b: slow_step(marker, s, b), tiny_lm.init_state, token_shards, tpu_type="v4-16",
                checkpoint_path=ckpt, max_retries_failure=0, **config,
            )
        except BaseException as e:  # surfaced by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=train)
    caplog.set_level("WARNING", logger="marin.tpu.runner")
    thread.start()
    try:
        wait_until(lambda: (latest_step(ckpt) or 0) >= 10, "a checkpoint at step >= 10 on the v4-16 slice")
        assert latest_step(ckpt) < config["num_steps"], "training finished before the host was killed"
        # The host without the slice's head resource (the placement group may have put either
        # JAX process there): its replacement below is an ordinary host of the same slice.
        (node,) = [nid for nid in sim.v4_16 if "TPU-v4-16-head" not in _node_resources(nid)]
        sim.kill_v4_16_host(node)
        assert thread.is_alive(), "training finished before the host was killed"
        sim.add_v4_16_host(head=False)  # the replacement host of the same slice
    finally:
        thread.join(timeout=600)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.step == 30 and result.resumed_from is not None and result.num_processes == 2
    assert result.mesh == {"data": 2 * CHIPS_PER_HOST}
    assert preemptions(caplog) >= 1  # the kill landed: it cost the run an attempt
    # one checkpoint per 5 steps, the last two kept (`keep=2`), the dead attempt's partial save removed
    assert latest_step(ckpt) == 30 and sorted(os.listdir(ckpt)) == ["25", "30"]

    reference = train_loop(tiny_lm.train_step, tiny_lm.init_state, token_shards,
                           checkpoint_path=str(tmp_path / "reference"), mesh=_mesh(8), **config)
    np.testing.assert_allclose(result.metrics["loss"], reference.metrics["loss"], rtol=1e-5)
    template = jax.eval_shape(tiny_lm.init_state, jax.random.key(config["seed"]))
    resumed, uninterrupted = load_checkpoint(ckpt, template), load_checkpoint(reference.checkpoint_path, template)
    assert resumed.data_position == uninterrupted.data_position
    for a, b in zip(jax.tree_util.tree_leaves(resumed.state["params"]),
                    jax.tree_util.tree_leaves(uninterrupted.state["params"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
