"""A whole experiment on gs:// (the local GCS emulator): outputs, status and info files."""

from __future__ import annotations

import json
from dataclasses import dataclass

import fsspec
import pytest

from marin.execution import (
    SKIPPED,
    Executor,
    ExecutorError,
    ExecutorStep,
    StepStatus,
    output_path_of,
    read_info,
    read_status,
    this_output_path,
    versioned,
)


@dataclass(frozen=True)
class Cfg:
    value: object
    output_path: object
    input_path: object = None
    fail: bool = False


def add(config: Cfg) -> None:
    total = 0
    if config.input_path:
        with fsspec.open(config.input_path) as f:
            total = json.load(f)["total"]
    if config.fail:
        raise ValueError(f"refusing {config.value}")
    with fsspec.open(f"{config.output_path}/out.json", "w") as f:
        json.dump({"total": total + config.value}, f)


def test_experiment_on_gcs_writes_status_info_and_record(gcs_bucket):
    prefix = f"{gcs_bucket}/exp"
    a = ExecutorStep("a", add, Cfg(versioned(1), this_output_path()))
    b = ExecutorStep("b", add, Cfg(versioned(2), this_output_path(), output_path_of(a, "out.json")))
    executor = Executor(prefix, poll_interval=0.05, settle=0.05, caller="gcs_exp.py")
    result = executor.run([b])
    a_path, b_path = result
    assert a_path.startswith(f"{gcs_bucket}/exp/a-") and list(result.values()) == ["SUCCESS", "SUCCESS"]
    with fsspec.open(f"{b_path}/out.json") as f:
        assert json.load(f) == {"total": 3}
    assert read_status(a_path) == read_status(b_path) == StepStatus.SUCCESS
    info = read_info(b_path)
    assert info["config"]["input_path"] == f"{a_path}/out.json" and info["dependencies"] == [a_path]
    fs = fsspec.filesystem("gs")
    (record,) = fs.ls(f"{gcs_bucket}/exp/experiments", refresh=True)
    assert [s["state"] for s in json.loads(fs.cat_file(record))["steps"]] == ["SUCCESS", "SUCCESS"]
    assert executor.run([b]) == {a_path: SKIPPED, b_path: SKIPPED}


def test_failure_on_gcs_is_recorded(gcs_bucket):
    a = ExecutorStep("a", add, Cfg(versioned(1), this_output_path(), fail=True))
    b = ExecutorStep("b", add, Cfg(versioned(2), this_output_path(), output_path_of(a, "out.json")))
    with pytest.raises(ExecutorError, match="refusing 1"):
        Executor(gcs_bucket, settle=0.05).run([b])
    a_path, b_path = (p.output_path for p in Executor(gcs_bucket).plan([b]).steps)
    assert read_status(a_path) == StepStatus.FAILED and read_status(b_path) == StepStatus.DEP_FAILED
    assert read_info(a_path)["name"] == "a"
