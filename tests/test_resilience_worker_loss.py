"""Worker nodes removed and added while the quickstart's cleaning pipeline runs on a multi-node
Ray: the outputs are byte-identical to a clean single-process run."""

import importlib.util
import sys
import threading
import time
from pathlib import Path

import pytest

from zephyr import create_backend, set_flow_backend

pytestmark = [pytest.mark.resilience, pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def load_quickstart():
    import cloudpickle

    spec = importlib.util.spec_from_file_location("quickstart_under_test", REPO / "experiments" / "quickstart.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import ray.cloudpickle

    cloudpickle.register_pickle_by_value(module)  # Ray workers cannot import experiments/
    ray.cloudpickle.register_pickle_by_value(module)  # and Ray pickles with its own copy
    return module


def test_nodes_come_and_go_while_the_quickstart_pipeline_runs(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    qs = load_quickstart()
    raw = tmp_path / "raw"
    qs.generate_raw(qs.RawConfig(str(raw), num_shards=16, docs_per_shard=800))

    reference = tmp_path / "reference"
    set_flow_backend(create_backend("sync", progress=False))
    try:
        qs.clean(qs.CleanConfig(str(raw), str(reference)))
    finally:
        set_flow_backend(None)

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        first = cluster.add_node(num_cpus=1)
        second = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        out = tmp_path / "out"
        set_flow_backend(create_backend("ray", max_parallelism=4, progress=False, scratch_dir=str(tmp_path / "scratch")))
        errors = []
        driver = threading.Thread(target=lambda: _capture(errors, qs.clean, qs.CleanConfig(str(raw), str(out))))
        driver.start()

        # a node dies in the map stage, a replacement joins; another dies while the outputs are written
        _wait_for(lambda: list((tmp_path / "scratch").glob("*/map-*.json")))
        cluster.remove_node(first, allow_graceful=False)
        third = cluster.add_node(num_cpus=1)
        _wait_for(lambda: any(p.name.endswith(".zst") for p in out.glob("*")) or not driver.is_alive(), timeout=120)
        cluster.remove_node(second, allow_graceful=False)
        cluster.add_node(num_cpus=1)
        driver.join(timeout=300)
        assert not driver.is_alive()
        assert errors == []
        names = sorted(p.name for p in reference.glob("part-*"))
        assert names and sorted(p.name for p in out.glob("part-*")) == names
        for name in names:
            assert (out / name).read_bytes() == (reference / name).read_bytes()
        assert third is not None
    finally:
        set_flow_backend(None)
        ray.shutdown()
        cluster.shutdown()


def _capture(errors, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # surfaced by the assertion in the main thread
        errors.append(e)


def _wait_for(condition, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not reached")
