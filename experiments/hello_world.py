"""Hello world of the executor: generate numbers, then compute their statistics.

    uv run python experiments/hello_world.py --prefix /tmp/x

Run it twice: the second run skips both steps. Change `n` below (a versioned field) and
both steps rerun under new paths; change `decimals` and only the stats step does.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass

import fsspec

from marin.execution.executor import ExecutorStep, executor_main, output_path_of, this_output_path, versioned


@dataclass(frozen=True)
class GenerateConfig:
    n: int
    seed: int
    output_path: str


def generate_numbers(config: GenerateConfig) -> None:
    """Write `n` random integers to `<output>/numbers.json`."""
    rng = random.Random(config.seed)
    numbers = [rng.randint(0, 100) for _ in range(config.n)]
    with fsspec.open(f"{config.output_path}/numbers.json", "w") as f:
        json.dump(numbers, f)


@dataclass(frozen=True)
class StatsConfig:
    input_path: str
    decimals: int
    output_path: str


def compute_stats(config: StatsConfig) -> None:
    """Read the numbers and write their count, mean, min and max to `<output>/stats.json`."""
    with fsspec.open(config.input_path) as f:
        numbers = json.load(f)
    stats = {
        "count": len(numbers),
        "mean": round(statistics.fmean(numbers), config.decimals),
        "min": min(numbers),
        "max": max(numbers),
    }
    with fsspec.open(f"{config.output_path}/stats.json", "w") as f:
        json.dump(stats, f)


numbers = ExecutorStep(
    name="hello_world/numbers",
    description="Random integers in [0, 100].",
    fn=generate_numbers,
    config=GenerateConfig(n=versioned(100), seed=versioned(0), output_path=this_output_path()),
)

stats = ExecutorStep(
    name="hello_world/stats",
    description="Count, mean, min and max of the numbers.",
    fn=compute_stats,
    config=StatsConfig(
        input_path=output_path_of(numbers, "numbers.json"),
        decimals=versioned(2),
        output_path=this_output_path(),
    ),
)

if __name__ == "__main__":
    executor_main(steps=[stats], description="Generate some numbers and compute their statistics.")
