"""A stage with one slow node: its time with and without second attempts of stragglers (issue 41).

A `ray.cluster_utils.Cluster` on this machine: a head with no CPUs and `--nodes` worker nodes of
`--cpus` CPUs each, the last one slow. One stage of `--shards` shards (`from_list(...).flat_map(...)
.write_jsonl(...)`), `max_parallelism` = every CPU; a shard's work is `--work` seconds, and
`--slowdown` times that on the slow node (a sleep: this machine's cores are shared, and a CPU-bound
model would measure their contention, not the tail). Ray places the shards; whatever lands on
the slow node is slow. Modes, alternating, `--repeats` times each, on the same cluster:

- off: `speculation=False` (the stage waits for the slow node's shards);
- default: the defaults (a second attempt past 3x the median and 10 s, once 75% are done);
- eager: `{"multiplier": 2, "min_seconds": 0, "fraction_done": 0.5}`.

Each run reports the stage's wall time (from the first submission to the last result, the losers'
drain included), the copies started and won, the worker seconds every attempt spent (the losers'
until their cancel landed: what the copies cost), the CPU seconds of the accepted tasks, and the
driver's peak RSS; outputs are checked against a plain-Python oracle every time.

    uv run python benchmarks/bench_stragglers.py --json benchmarks/results/stragglers.json

`--overhead N` instead measures what watching for stragglers costs a stage that has none: N
trivial shards on threadpool (4 threads), speculation off and on (eager thresholds, so the watch
runs from the first finished shard), alternating, 5 runs each; it prints the medians.

    uv run python benchmarks/bench_stragglers.py --overhead 5000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_raylet_start_wait_time_s", "60")
os.environ.setdefault("RAY_worker_register_timeout_seconds", "300")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine  # noqa: E402

MODES = {
    "off": False,
    "default": None,  # the backend's defaults (ZEPHYR_SPECULATION unset)
    "eager": {"multiplier": 2.0, "min_seconds": 0.0, "fraction_done": 0.5},
}


def shard_work(item):
    """One shard: `work` seconds (times `slowdown` on the slow node), then 100 records. Leaves
    `<events>/<shard>-<start ns>` holding its node and, when it ends, how long it ran."""
    import ray

    events, i, work, slowdown, slow = item
    node = ray.get_runtime_context().get_node_id()
    marker = Path(events, f"{i}-{time.time_ns()}")
    start = time.monotonic()
    until = start + work * (slowdown if node == slow else 1.0)
    try:
        while time.monotonic() < until:
            time.sleep(0.02)  # interruptible: a cancel lands within 20 ms
        for j in range(100):
            yield {"shard": i, "j": j}
    finally:
        marker.write_text(json.dumps({"node": node, "ran_s": time.monotonic() - start, "slow": node == slow}))


def start_cluster(nodes: int, cpus: int):
    import ray
    from ray.cluster_utils import Cluster

    from zephyr.backends.ray_local import free_port

    cluster = Cluster(initialize_head=False)
    _add_node(cluster, num_cpus=0, include_dashboard=False, dashboard_port=free_port(), dashboard_agent_listen_port=free_port())
    workers = [_add_node(cluster, num_cpus=cpus) for _ in range(nodes)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster, workers[-1]


def _add_node(cluster, attempts: int = 5, **args):
    """A node, started again if it timed out while starting (a raylet on a loaded machine)."""
    for attempt in range(1, attempts + 1):
        try:
            return cluster.add_node(**args)
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            print(f"a node did not start (attempt {attempt}); retrying", file=sys.stderr)


def run_once(mode: str, args, slow: str, work_dir: str) -> dict:
    from zephyr import Dataset, create_backend

    events = tempfile.mkdtemp(dir=work_dir, prefix=f"events-{mode}-")
    out = tempfile.mkdtemp(dir=work_dir, prefix=f"out-{mode}-")
    options = {} if MODES[mode] is None else {"speculation": MODES[mode]}
    backend = create_backend("ray", max_parallelism=args.nodes * args.cpus, progress=False, **options)
    items = [(events, i, args.work, args.slowdown, slow) for i in range(args.shards)]
    ds = Dataset.from_list(items).flat_map(shard_work).write_jsonl(f"{out}/part-{{shard:03d}}.jsonl")
    try:
        execution = backend.execute(ds)
        started = time.monotonic()
        paths = list(execution)
        took = time.monotonic() - started
    finally:
        backend.close()
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines()]
    assert rows == [{"shard": i, "j": j} for i in range(args.shards) for j in range(100)], "outputs differ from the oracle"
    attempts = [json.loads(p.read_text()) for p in Path(events).iterdir()]
    stats = execution.stats[0]
    return {"mode": mode, "stage_s": round(took, 2), "copies": stats.speculated, "won_by_copy": stats.won_by_copy,
            "attempts": len(attempts), "on_slow_node": sum(a["slow"] for a in attempts),
            "worker_s": round(sum(a["ran_s"] for a in attempts), 1), "accepted_cpu_s": round(stats.cost.cpu_s, 2),
            "driver_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def overhead(shards: int) -> None:
    from zephyr import Dataset, create_backend

    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(5):
        for mode, option in (("off", False), ("on", {"multiplier": 3.0, "min_seconds": 10.0, "fraction_done": 0.0})):
            backend = create_backend("threadpool", max_parallelism=4, progress=False, speculation=option)
            try:
                started = time.perf_counter()
                assert sum(backend.execute(Dataset.from_list(list(range(shards))).map(lambda x: x + 1))) == shards * (shards + 1) // 2
                times[mode].append(time.perf_counter() - started)
            finally:
                backend.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"{shards} trivial shards on threadpool(4), medians of 5: off {off:.3f}s, on {on:.3f}s, "
          f"on/off {on / off:.3f} ({(on - off) / shards * 1e6:+.1f} us per shard); load {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes; the last is slow")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs per worker node")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--work", type=float, default=2.0, help="seconds per shard on a fast node")
    parser.add_argument("--slowdown", type=float, default=15.0, help="how many times slower the slow node is")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--overhead", type=int, metavar="N", help="instead: the watch's cost on N trivial shards (threadpool)")
    args = parser.parse_args()
    if args.overhead:
        return overhead(args.overhead)
    os.environ.pop("ZEPHYR_SPECULATION", None)  # "default" means the defaults

    import ray

    cluster, slow = start_cluster(args.nodes, args.cpus)
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stragglers-") as work_dir:
            run_once("eager", args, slow.node_id, work_dir)  # warm-up: workers start on every node
            for _ in range(args.repeats):
                for mode in MODES:
                    runs.append(run_once(mode, args, slow.node_id, work_dir))
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\n{args.shards} shards of {args.work:g}s on {args.nodes} nodes x {args.cpus} CPUs, the last {args.slowdown:g}x slower; "
          f"load {load_average()}\n")
    print("| mode | stage s (median) | vs off | copies | won by copy | attempts | worker s | accepted CPU s | driver peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    off = statistics.median(r["stage_s"] for r in runs if r["mode"] == "off")
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        stage = statistics.median(r["stage_s"] for r in mine)
        print(f"| {mode} | {stage:.1f} ({', '.join(str(r['stage_s']) for r in mine)}) | {stage / off:.2f} | "
              f"{statistics.median(r['copies'] for r in mine):g} | {statistics.median(r['won_by_copy'] for r in mine):g} | "
              f"{statistics.median(r['attempts'] for r in mine):g} | {statistics.median(r['worker_s'] for r in mine):.1f} | "
              f"{statistics.median(r['accepted_cpu_s'] for r in mine):.2f} | {max(r['driver_peak_rss_mib'] for r in mine):.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "args": vars(args), "load": load_average(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
