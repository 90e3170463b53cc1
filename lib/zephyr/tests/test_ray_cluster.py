"""The Ray backend on a real multi-node Ray: a worker node killed mid-run, and token auth.

These tests start their own clusters (on free ports, torn down in finalizers), so they shut the
shared session Ray down first.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from zephyr import Dataset, counters, create_backend
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _slow_shard(i, attempts_dir, seconds):
    """One shard: leaves a marker per attempt naming its node, takes `seconds`, yields 200 records."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    Path(attempts_dir, f"shard-{i}-node-{node}-pid-{os.getpid()}-{time.monotonic_ns()}").touch()
    time.sleep(seconds)
    for j in range(200):
        counters.increment("records")
        yield {"shard": i, "j": j, "text": f"document {i}-{j}"}


def _pipeline(out_pattern, attempts_dir, n=12, seconds=1.5):
    return Dataset.from_list(list(range(n))).flat_map(lambda i: _slow_shard(i, attempts_dir, seconds)).write_jsonl(out_pattern)


def test_killing_a_worker_node_costs_only_its_in_flight_shards(tmp_path, ray_cluster, wait_until):
    import ray

    reference_dir = tmp_path / "reference"
    sync = create_backend("sync", progress=False)
    # the reference needs no time to aim a kill at: its shards do not sleep (12 x 1.5 s saved)
    list(sync.execute(_pipeline(str(reference_dir / "part-{shard:03d}.jsonl.zst"), tmp_path, seconds=0)))

    cluster = ray_cluster()
    victim = cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    cluster.connect()

    attempts = tmp_path / "attempts"
    attempts.mkdir()
    backend = create_backend("ray", max_parallelism=4, progress=False)

    out_dir = tmp_path / "out"
    execution = backend.execute(_pipeline(str(out_dir / "part-{shard:03d}.jsonl.zst"), attempts))
    outcome = {}
    driver = threading.Thread(target=lambda: _capture(outcome, lambda: list(execution)), daemon=True)
    driver.start()
    # wait until both nodes run shards, then kill one the way a preemption does (Ray's node
    # helpers must run on the main thread, so the pipeline is driven from another one)
    def started_on_both_nodes():
        assert driver.is_alive(), f"the pipeline ended before the node kill, which would not land: {outcome}"
        return len(list(attempts.iterdir())) >= 4 and any(f"-node-{victim.node_id}-" in p.name for p in attempts.iterdir())

    wait_until(started_on_both_nodes, "4 shards to start on the 2 nodes")
    cluster.kill(victim)
    assert driver.is_alive(), "the pipeline finished before the node was killed"
    cluster.add_node(num_cpus=2)  # the autoscaler brings a replacement
    driver.join(timeout=600)
    assert not driver.is_alive(), "the pipeline did not finish within 600s of the node kill"
    assert "error" not in outcome, outcome.get("error")
    paths = outcome["value"]

    assert [Path(p).name for p in paths] == [f"part-{i:03d}.jsonl.zst" for i in range(12)]
    for name in sorted(set(os.listdir(reference_dir)) - {RECORD_NAME}):
        assert (out_dir / name).read_bytes() == (reference_dir / name).read_bytes()
    assert sorted(os.listdir(out_dir)) == sorted(os.listdir(reference_dir))  # no temporary litter
    # each shard counted once in the totals, however often it ran
    assert execution.counters["records"] == 12 * 200
    # the kill landed: at least one shard in flight on the dead node ran again, and only those
    # (2 CPUs there) did. Ray retried them itself (ray_task_retries), so Zephyr saw no loss.
    runs: dict[str, list[str]] = {}
    for marker in attempts.iterdir():
        shard, node = marker.name.split("-")[1], marker.name.split("-node-")[1].split("-pid-")[0]
        runs.setdefault(shard, []).append(node)
    rerun = {shard: nodes for shard, nodes in runs.items() if len(nodes) > 1}
    assert sorted(runs, key=int) == [str(i) for i in range(12)]
    assert 1 <= len(rerun) and sum(len(nodes) - 1 for nodes in rerun.values()) <= 2, rerun
    assert all(victim.node_id in nodes for nodes in rerun.values()), rerun
    assert execution.stats[0].retries_user == 0

    # custom resources steer placement: only the node that offers them runs these shards
    special = cluster.add_node(num_cpus=2, resources={"TPU": 4, "TPU-v4-8-head": 1})
    cluster.cluster.wait_for_nodes()
    on_tpu = create_backend("ray", max_parallelism=4, progress=False, resources={"TPU": 4, "TPU-v4-8-head": 1})
    nodes = set(on_tpu.execute(Dataset.from_list(list(range(4))).map(lambda _: ray.get_runtime_context().get_node_id())))
    assert nodes == {special.node_id}


def _capture(outcome: dict, fn) -> None:
    try:
        outcome["value"] = fn()
    except BaseException as e:  # reported by the main thread's assertion
        outcome["error"] = e


TOKEN_SCRIPT = textwrap.dedent(
    """
    from zephyr import Dataset, flow_backend

    def main():
        print("result:", list(flow_backend().execute(Dataset.from_list([1, 2, 3]).map(lambda x: x * 10))))
    """
)


@pytest.fixture
def token_head(tmp_path, wait_until, free_port):
    """A token-auth `ray start --head` on free ports with a private temp dir; killed after the test."""
    token_home = tmp_path / "home"
    token_home.mkdir()
    token_file = tmp_path / "auth_token"
    token_file.write_text("a" * 32 + "zephyrtesttoken" + "b" * 17)
    env = {**os.environ, "HOME": str(token_home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ztok-")  # short: Ray's socket paths must stay under ~107 chars
    log = tmp_path / "head.log"
    ports = {name: free_port() for name in ("ray-client-server", "node-manager", "object-manager", "dashboard",
                                              "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent",
                                              "metrics-export", "min-worker")}
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
            f"--temp-dir={temp_dir}", "--num-cpus=2", "--include-dashboard=false", "--max-worker-port=0",
            *(f"--{name}-port={value}" for name, value in ports.items())]
    with open(log, "wb") as out:
        head = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "Ray runtime started" in log.read_text() or head.poll() is not None,
                   f"the token-auth Ray head to start (log: {log})")
        assert head.poll() is None, f"the head exited with {head.returncode}:\n{log.read_text()[-3000:]}"
        yield f"127.0.0.1:{port}", env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_token_authenticated_cluster_accepts_the_token_and_refuses_others(tmp_path, token_head):
    address, env = token_head
    script = tmp_path / "job.py"
    script.write_text(TOKEN_SCRIPT)
    with_token = _run_client(script, address, env)
    assert with_token.returncode == 0, with_token.stderr[-2000:]
    assert "result: [10, 20, 30]" in with_token.stdout

    other_home = tmp_path / "intruder"
    other_home.mkdir()
    wrong = tmp_path / "wrong_token"
    wrong.write_text("c" * 64)
    for token_env in ({"RAY_AUTH_TOKEN_PATH": str(wrong)}, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent")}):
        intruder = {**env, "HOME": str(other_home), **token_env}
        refused = _run_client(script, address, intruder)
        assert refused.returncode != 0
        assert "result:" not in refused.stdout
        assert "auth" in (refused.stderr + refused.stdout).lower()


def _run_client(script, address, env, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "zephyr", "--backend=ray", f"--address={address}", "--quiet", str(script)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
