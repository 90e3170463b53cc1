"""Worker nodes removed and added while the quickstart's cleaning pipeline runs on a multi-node
Ray: the outputs are byte-identical to a clean single-process run."""

import importlib.util
import sys
import threading
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


def test_nodes_come_and_go_while_the_quickstart_pipeline_runs(tmp_path, ray_cluster, wait_until):
    qs = load_quickstart()
    raw = tmp_path / "raw"
    qs.generate_raw(qs.RawConfig(str(raw), num_shards=16, docs_per_shard=800))

    reference = tmp_path / "reference"
    set_flow_backend(create_backend("sync", progress=False))
    try:
        qs.clean(qs.CleanConfig(str(raw), str(reference)))
    finally:
        set_flow_backend(None)

    cluster = ray_cluster()
    first = cluster.add_node(num_cpus=1)
    second = cluster.add_node(num_cpus=1)
    cluster.connect()
    out = tmp_path / "out"
    backend = create_backend("ray", max_parallelism=4, progress=False, scratch_dir=str(tmp_path / "scratch"))
    set_flow_backend(backend)
    try:
        outcome = {}
        driver = threading.Thread(target=_capture, args=(outcome, qs.clean, qs.CleanConfig(str(raw), str(out))), daemon=True)
        driver.start()

        # a node dies in the map stage, a replacement joins; another dies while the outputs are written
        wait_until(lambda: list((tmp_path / "scratch").glob("*/map-*.json")) or not driver.is_alive(),
                   "the first map shard of the dedup shuffle to finish")
        cluster.kill(first)
        cluster.add_node(num_cpus=1)
        wait_until(lambda: any(p.name.endswith(".zst") for p in out.glob("*")) or not driver.is_alive(),
                   "the first output file to be written")
        cluster.kill(second)
        cluster.add_node(num_cpus=1)
        driver.join(timeout=600)
        assert not driver.is_alive(), "the pipeline did not finish within 600s of the second node kill"
    finally:
        set_flow_backend(None)
    assert "error" not in outcome, outcome.get("error")
    names = sorted(p.name for p in reference.glob("part-*"))
    assert names and sorted(p.name for p in out.glob("part-*")) == names
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())  # nothing else left
    assert not any((tmp_path / "scratch").iterdir())  # shuffle scratch removed


def _capture(outcome, fn, *args):
    try:
        outcome["value"] = fn(*args)
    except BaseException as e:  # surfaced by the assertion in the main thread
        outcome["error"] = e
