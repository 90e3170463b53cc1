"""Second attempts of stragglers on a real multi-node Ray (issue 41): one node is made slow.

A cluster of two fast nodes and one slow node. Every task that runs on the slow node stalls (an
interruptible wait of up to SLOW_S seconds, a stand-in for a throttled or sick machine); the test's
backend routes the first attempts of two shards there (as a scheduler would), and Ray places the
rest. The run must end long before the slow attempts would, with every shard's output and
counters exact, each slow attempt cancelled, and each copy run and finished on another node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from zephyr import Dataset, counters
from zephyr.backends.ray import RayBackend
from zephyr.status import RECORD_NAME

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.resilience]

SLOW_S = 600.0  # how long an attempt on the slow node would take
ROUTED = {0, 1}  # shards whose first attempt the backend sends to the slow node


def _shard(item):
    """Shard `i`: ~1 s of work, stalled for SLOW_S on the slow node; a marker per attempt says
    where it ran and how it ended (`end`, or the exception that stopped it)."""
    import ray

    events, i, slow = item
    node = ray.get_runtime_context().get_node_id()
    stem = f"{i}-{node}-{time.monotonic_ns()}"
    Path(events, f"start-{stem}").touch()
    try:
        until = time.monotonic() + (SLOW_S if node == slow else 1.0)
        while time.monotonic() < until:
            time.sleep(0.05)  # interruptible: a cancel lands within 50 ms
        for j in range(100):
            counters.increment("docs")
            yield {"shard": i, "j": j}
    except BaseException as e:
        Path(events, f"raised-{stem}").write_text(type(e).__name__)
        raise
    Path(events, f"end-{stem}").touch()


class _Routed(RayBackend):
    """The Ray backend, but the first attempt of each ROUTED shard must run on `node` (the test's
    stand-in for Ray placing it there); second attempts go through the real `submit_again`."""

    def __init__(self, node: str, **options):
        super().__init__(**options)
        self.node = node

    def submit(self, fn, shared, arg):
        if getattr(arg, "shard", None) not in ROUTED:
            return super().submit(fn, shared, arg)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from zephyr.backends.ray_running import call_marked

        self._ray()
        key = self._running.new_key()
        remote = ray.remote(call_marked).options(**{**self._options, "scheduling_strategy": NodeAffinitySchedulingStrategy(self.node, soft=False)})
        handle = remote.remote(self.bound(fn), shared, arg, key)
        self._running.remember(handle, key)
        return handle


def _blocks(shared, task):
    """Runs until cancelled (bounded by SLOW_S)."""
    until = time.monotonic() + SLOW_S
    while time.monotonic() < until:
        time.sleep(0.05)


def _node(shared, task):
    import ray

    return ray.get_runtime_context().get_node_id()


def _copies_avoid_the_first_attempts_node(backend, node: str, wait_until) -> list[str]:
    """Start a call on `node` (idle now, so it has free CPUs), then second attempts of it one after
    another: the nodes they ran on. Without the label selector Ray would put about a third there."""
    from zephyr.tasks import ShardTask

    task = ShardTask(0, min(ROUTED), 1, "probe")
    first = backend.submit(_blocks, None, task)
    try:
        wait_until(lambda: backend.placement(first) == node, "the first attempt to run on the slow node")
        return [backend.result(backend.submit_again(_node, None, task, first)) for _ in range(8)]
    finally:
        backend.cancel([first])


def _attempts(events: Path) -> list[dict]:
    """Every attempt: shard, node, and how it ended ("end", an exception's name, or None)."""
    names = set(os.listdir(events))
    found = []
    for name in names:
        if name.startswith("start-"):
            stem = name[len("start-"):]
            shard, node, _ = stem.split("-")
            ended = "end" if f"end-{stem}" in names else Path(events, f"raised-{stem}").read_text() if f"raised-{stem}" in names else None
            found.append({"shard": int(shard), "node": node, "ended": ended})
    return found


def test_a_slow_node_does_not_hold_the_stage(tmp_path, ray_cluster, wait_until):
    cluster = ray_cluster()
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    slow = cluster.add_node(num_cpus=2)
    cluster.connect()
    events = tmp_path / "events"
    events.mkdir()
    out = tmp_path / "out"
    backend = _Routed(slow.node_id, max_parallelism=6, progress=False,
                      speculation={"multiplier": 2.0, "min_seconds": 3.0, "fraction_done": 0.5})
    pipeline = Dataset.from_list([(str(events), i, slow.node_id) for i in range(12)]).flat_map(_shard)
    started = time.monotonic()
    try:
        execution = backend.execute(pipeline.write_jsonl(f"{out}/part-{{shard:02d}}.jsonl"))
        paths = list(execution)
        took = time.monotonic() - started
        probed = _copies_avoid_the_first_attempts_node(backend, slow.node_id, wait_until)
    finally:
        backend.close()
    assert len(probed) == 8 and slow.node_id not in probed, probed

    attempts = _attempts(events)
    on_slow = [a for a in attempts if a["node"] == slow.node_id]
    # the slowness landed: the routed shards' first attempts ran on the slow node, and no attempt
    # there ever finished; each was cancelled (Ray raises KeyboardInterrupt in the task)
    assert ROUTED <= {a["shard"] for a in on_slow}
    assert all(a["ended"] == "KeyboardInterrupt" for a in on_slow), on_slow
    # the tail shrank: the run ended long before an attempt on the slow node would have
    assert took < SLOW_S / 2, took
    # each shard slowed there finished on another node, in its second attempt
    for shard in {a["shard"] for a in on_slow}:
        elsewhere = [a for a in attempts if a["shard"] == shard and a["node"] != slow.node_id]
        assert [a["ended"] for a in elsewhere] == ["end"], (shard, attempts)
    stats = execution.stats[0]
    assert stats.speculated == stats.won_by_copy == len({a["shard"] for a in on_slow})
    # outputs and counters exact: one file per shard, each of its 100 records, counted once
    assert sorted(os.listdir(out)) == [RECORD_NAME] + [f"part-{i:02d}.jsonl" for i in range(12)]
    for i, path in enumerate(paths):
        assert [orjson.loads(line) for line in Path(path).read_bytes().splitlines()] == [{"shard": i, "j": j} for j in range(100)]
    assert execution.counters["docs"] == 1200
    record = orjson.loads((out / RECORD_NAME).read_bytes())
    copies = record["stages"][0]["second_attempts"]
    assert {c["shard"] for c in copies} == {a["shard"] for a in on_slow}
    assert all(c["first_node"] == slow.node_id and c["won_by"] == "second" for c in copies), copies
    print(f"\nstage took {took:.1f}s with {len(copies)} shard(s) copied off the slow node "
          f"(an attempt there would take {SLOW_S:.0f}s)")
