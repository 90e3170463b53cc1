"""A minimal Ray job script, and the test that keeps it working.

The internal guide submits this file as its example of a job script:

    ray job submit --address http://127.0.0.1:8265 --working-dir . --no-wait -- python tests/test_ray_cluster.py
    uv run python -m marin.run.ray_run --cluster local -- python tests/test_ray_cluster.py
    uv run python tests/test_ray_cluster.py        # no cluster: an embedded Ray of its own
    uv run pytest tests/test_ray_cluster.py        # the tests, on the test session's Ray

The format a job script needs: connect with `ray.init()` first (a job's driver finds its
cluster in `RAY_ADDRESS`, which Ray sets for it), then dispatch `@ray.remote` tasks and
`ray.get` their results, all from a `main()` run by the `__main__` guard. On a cluster with a
v4-8 host (every Marin cluster, and the `local` one, which simulates one) it also runs one task
on a whole TPU host, the way the guide asks for TPUs: the `TPU-v4-8-head` resource, and the
libtpu lockfile removed when the task ends (`marin.utils.remove_tpu_lockfile_on_exit`).

It prints one line, `RAY_CLUSTER_OK {json}`, and exits non-zero if a result is wrong.
"""

from __future__ import annotations

import json
import os
import sys

import ray

from marin.utils import remove_tpu_lockfile_on_exit

try:  # a job on the cluster image has no pytest; the test run does
    import pytest

    pytestmark = pytest.mark.ray
except ImportError:
    pass

V4_8 = {"TPU": 4, "TPU-v4-8-head": 1}


@ray.remote(num_cpus=1)
def square(x: int) -> int:
    return x * x


@ray.remote(num_cpus=1, resources=V4_8)
@remove_tpu_lockfile_on_exit
def on_tpu_host() -> dict:
    """Runs on the head host of a v4-8 slice, holding all of its chips."""
    assigned = ray.get_runtime_context().get_assigned_resources()
    return {name: assigned.get(name) for name in V4_8}


def run_tasks() -> dict:
    """The job's work, on the Ray this process is connected to."""
    result = {"sum_of_squares": sum(ray.get([square.remote(i) for i in range(10)]))}
    if ray.cluster_resources().get("TPU-v4-8-head"):
        result["tpu_host"] = ray.get(on_tpu_host.remote())
    return result


def main() -> int:
    # Boilerplate: join the job's cluster (RAY_ADDRESS), or start a Ray of our own ("local"),
    # never whichever `ray start` head this machine happened to start last.
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False)
    result = run_tasks()
    print("RAY_CLUSTER_OK", json.dumps(result, sort_keys=True), flush=True)
    ok = result["sum_of_squares"] == 285 and result.get("tpu_host", V4_8) == V4_8
    return 0 if ok else 1


def test_tasks_run_on_ray(ray_shared):
    assert run_tasks() == {"sum_of_squares": sum(i * i for i in range(10))}  # the test Ray has no TPU host


def test_tpu_task_asks_for_a_whole_v4_8_host_and_removes_the_lockfile(ray_shared, tmp_path):
    options = on_tpu_host._default_options  # what Ray schedules the task with
    assert options["resources"] == {"TPU": 4, "TPU-v4-8-head": 1} and options["num_cpus"] == 1
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("held by a finished libtpu")
    # the test Ray has no TPU host: run the same task without asking for one
    env = {"env_vars": {"MARIN_LIBTPU_LOCKFILE": str(lockfile)}}
    assigned = ray.get(on_tpu_host.options(resources={}, runtime_env=env).remote())
    assert assigned == {"TPU": None, "TPU-v4-8-head": None}
    assert not lockfile.exists()


if __name__ == "__main__":
    sys.exit(main())
