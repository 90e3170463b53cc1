"""Hello world on a cluster: an executor experiment whose step fans out as Ray tasks.

    uv run python -m marin.run.ray_run --cluster local --no_wait -- python experiments/tutorials/hello_world.py
    uv run lib/marin/src/marin/run/ray_run.py --cluster infra/marin-us-central1.yaml --no_wait -- python experiments/tutorials/hello_world.py
    uv run python experiments/tutorials/hello_world.py --prefix /tmp/x     # here, on an embedded Ray

One step, `tutorials/hello_world`, sends one `@ray.remote` task per name and writes what they
return to `<output>/greetings.jsonl`; a second run finds the step done and skips it. Outputs go
under `--prefix`, else `$MARIN_PREFIX` (set on every cloud cluster to its bucket), else
`<tmp>/marin-tutorials`. The executor itself is introduced by `experiments/hello_world.py`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass

import fsspec
import ray

from marin.execution.executor import ExecutorStep, executor_main, this_output_path, versioned


@ray.remote(num_cpus=1)
def greet(name: str) -> dict:
    return {"greeting": f"Hello, {name}!", "host": socket.gethostname(), "pid": os.getpid()}


@dataclass(frozen=True)
class HelloConfig:
    names: list[str]
    output_path: str


def say_hello(config: HelloConfig) -> None:
    """One Ray task per name, dispatched at once and collected in order."""
    greetings = ray.get([greet.remote(name) for name in config.names])
    with fsspec.open(f"{config.output_path}/greetings.jsonl", "w") as f:
        f.writelines(json.dumps(g) + "\n" for g in greetings)
    print("\n".join(g["greeting"] for g in greetings), flush=True)


hello = ExecutorStep(
    name="tutorials/hello_world",
    description="Greetings from Ray tasks.",
    fn=say_hello,
    config=HelloConfig(names=versioned(["world", "Zephyr", "Marin"]), output_path=this_output_path()),
)

if __name__ == "__main__":
    if "--prefix" not in sys.argv and not os.environ.get("MARIN_PREFIX"):
        os.environ["MARIN_PREFIX"] = os.path.join(tempfile.gettempdir(), "marin-tutorials")
    # a job's driver joins its cluster (RAY_ADDRESS); run by hand, it starts a Ray of its own
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False)
    executor_main(steps=[hello], description="Hello world on a cluster.")
