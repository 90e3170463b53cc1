"""`executor_main(..., dashboard=True)`: Zephyr's status page shows the pipelines the steps run."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from marin.execution import ExecutorMainConfig, ExecutorStep, executor_main, this_output_path

pytest.importorskip("zephyr")

DEADLINE = 300.0  # generous: a loaded 2-core machine


@dataclass(frozen=True)
class GatedConfig:
    gates: str
    output_path: str


def _wait_at_gate(item):
    gates, i = item
    deadline = time.monotonic() + DEADLINE
    while not os.path.exists(f"{gates}/{i}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {i} never opened")
        time.sleep(0.02)
    return {"i": i}


def gated_pipeline(config: GatedConfig) -> None:
    from zephyr import Dataset, create_backend

    backend = create_backend("threadpool", max_parallelism=2, progress=False)
    ds = Dataset.from_list([(config.gates, i) for i in range(4)]).map(_wait_at_gate)
    list(backend.execute(ds.write_jsonl(f"{config.output_path}/part-{{shard}}.jsonl")))


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_executor_main_serves_the_status_page_of_its_steps_pipelines(tmp_path, capsys, free_port):
    gates = tmp_path / "gates"
    gates.mkdir()
    step = ExecutorStep(name="gated", fn=gated_pipeline, config=GatedConfig(gates=str(gates), output_path=this_output_path()))
    port = free_port()
    config = ExecutorMainConfig(prefix=str(tmp_path / "out"), dashboard=True, dashboard_port=port)
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(result=executor_main([step], config=config)), daemon=True)
    runner.start()
    try:
        base = f"http://127.0.0.1:{port}/"

        def running_snapshot():
            try:
                s = get_json(base + "api/snapshot")
            except (urllib.error.URLError, ConnectionError):
                return None  # not listening yet
            return s if s.get("state") == "running" and s["stages"][0]["shards"]["running"] == 2 else None

        deadline = time.monotonic() + DEADLINE
        while (s := running_snapshot()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s is not None, "the step's pipeline never showed on the status page"
        assert s["stages"][0]["num_shards"] == 4 and "map(_wait_at_gate)" in s["stages"][0]["ops"]
        assert f"marin: zephyr status page at {base}" in capsys.readouterr().err
    finally:
        for i in range(4):
            (gates / str(i)).touch()
        runner.join(timeout=DEADLINE)
    assert not runner.is_alive(), f"the experiment did not finish within {DEADLINE:.0f}s"
    assert list(outcome["result"].values()) == ["SUCCESS"]
    (output_path,) = outcome["result"]
    assert json.load(open(f"{output_path}/.zephyr-run.json"))["state"] == "succeeded"
    with pytest.raises(urllib.error.URLError):  # stopped with the run
        get_json(f"http://127.0.0.1:{port}/api/runs")
