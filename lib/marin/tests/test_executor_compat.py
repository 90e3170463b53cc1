"""Marin experiments run unchanged: the canonical module, step helpers, non-blocking inputs,
versioned() misuse, and the status file as Marin's tools read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from dataclasses import dataclass

import pytest

import marin.execution
from marin.execution.executor import (
    THIS_OUTPUT_PATH,
    Executor,
    ExecutorError,
    ExecutorMainConfig,
    ExecutorStep,
    InputName,
    OutputName,
    ensure_versioned,
    executor_main,
    get_executor_step,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CANONICAL_NAMES = [
    "ExecutorStep",
    "executor_main",
    "ExecutorMainConfig",
    "InputName",
    "OutputName",
    "output_path_of",
    "this_output_path",
    "THIS_OUTPUT_PATH",
    "versioned",
    "ensure_versioned",
    "unwrap_versioned_value",
    "get_executor_step",
]


def test_every_experiment_name_imports_from_marin_execution_executor():
    import marin.execution.executor as canonical

    for name in CANONICAL_NAMES:
        assert name in canonical.__all__, name
        assert getattr(marin.execution, name) is getattr(canonical, name), name
    assert THIS_OUTPUT_PATH == this_output_path() == OutputName(None)


@dataclass(frozen=True)
class Cfg:
    log_dir: str
    value: object = 0
    input_path: object = None
    other_path: object = None
    output_path: object = THIS_OUTPUT_PATH


def record(config: Cfg) -> None:
    """Leaves its resolved config in log_dir (so tests see paths and count runs)."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "x.txt"), "w") as f:
        f.write(str(config.value))
    with open(os.path.join(config.log_dir, uuid.uuid4().hex), "w") as f:
        json.dump({"output_path": config.output_path, "input_path": config.input_path, "other_path": config.other_path}, f)


def calls(log_dir) -> list[dict]:
    return [json.load(open(os.path.join(log_dir, name))) for name in sorted(os.listdir(log_dir))]


@pytest.fixture
def logs(tmp_path):
    path = tmp_path / "logs"
    path.mkdir()
    return str(path)


def make(tmp_path, **kwargs) -> Executor:
    return Executor(str(tmp_path / "out"), caller="exp.py", poll_interval=0.05, **kwargs)


def test_cd_truediv_and_as_input_name_refer_into_a_steps_output(tmp_path, logs):
    a = ExecutorStep("a", record, Cfg(logs, versioned(1)))
    b = ExecutorStep("b", record, Cfg(logs, input_path=a / "x.txt", other_path=a.cd("sub").cd("deep")))
    c = ExecutorStep("c", record, Cfg(logs, input_path=a.as_input_name(), other_path=[output_path_of(a, "x.txt")]))
    result = make(tmp_path).run([b, c])
    a_path = next(p for p in result if "/a-" in p)
    by_step = {os.path.basename(call["output_path"]).split("-")[0]: call for call in calls(logs)}
    assert by_step["b"]["input_path"] == f"{a_path}/x.txt" and by_step["b"]["other_path"] == f"{a_path}/sub/deep"
    assert by_step["c"]["input_path"] == a_path and by_step["c"]["other_path"] == [f"{a_path}/x.txt"]
    plan = make(tmp_path).plan([b])
    assert plan.steps[1].version["config"]["input_path"]["subpath"] == "x.txt"  # the subpath counts in the version


def test_with_output_path_is_a_copy_that_writes_elsewhere(tmp_path, logs):
    a = ExecutorStep("a", record, Cfg(logs, versioned(1)))
    moved = a.with_output_path("custom/a")
    assert a.override_output_path is None and moved.name == "a" and moved.config is a.config
    b = ExecutorStep("b", record, Cfg(logs, input_path=moved / "x.txt"))
    result = make(tmp_path).run([b])
    moved_path = str(tmp_path / "out" / "custom" / "a")
    assert list(result)[0] == moved_path and os.path.exists(f"{moved_path}/x.txt")
    (b_call,) = [call for call in calls(logs) if call["output_path"] != moved_path]
    assert b_call["input_path"] == f"{moved_path}/x.txt"


def test_nonblocking_input_counts_in_the_version_but_is_neither_waited_for_nor_run(tmp_path, logs):
    def checkpoints(value):
        return ExecutorStep("train", record, Cfg(logs, versioned(value)))

    def evaluate(train):
        return ExecutorStep("eval", record, Cfg(logs, input_path=output_path_of(train, "ckpt").nonblocking()))

    result = make(tmp_path).run([evaluate(checkpoints(1))])
    ((eval_path, state),) = result.items()
    assert state == "SUCCESS" and len(calls(logs)) == 1  # train did not run
    train_path = make(tmp_path).plan([checkpoints(1)]).steps[0].output_path
    assert calls(logs)[0]["input_path"] == f"{train_path}/ckpt" and not os.path.exists(train_path)
    # the referenced step's version counts: another train config gives another eval path
    assert make(tmp_path).plan([evaluate(checkpoints(2))]).steps[0].output_path != eval_path
    # ... and so does blocking vs non-blocking
    blocking = ExecutorStep("eval", record, Cfg(logs, input_path=output_path_of(checkpoints(1), "ckpt")))
    assert make(tmp_path).plan([blocking]).steps[-1].output_path != eval_path
    # a step that needs train normally still runs it, before itself
    train = checkpoints(1)
    steps = [evaluate(train), ExecutorStep("report", record, Cfg(logs, input_path=train / "x.txt"))]
    names = {p.output_path: p.name for p in make(tmp_path).plan(steps).steps}
    both = make(tmp_path).run(steps)  # (in the order the steps finished)
    assert {names[path]: state for path, state in both.items()} == {"eval": "SKIPPED", "train": "SUCCESS", "report": "SUCCESS"}
    assert os.path.exists(f"{train_path}/x.txt")


def test_nonblocking_input_does_not_fail_with_a_failed_step(tmp_path, logs):
    def broken(config):
        raise RuntimeError("training crashed")

    train = ExecutorStep("train", broken, Cfg(logs, versioned(1)))
    with pytest.raises(ExecutorError):
        make(tmp_path).run([train])
    evaluate = ExecutorStep("eval", record, Cfg(logs, input_path=train.as_input_name().nonblocking()))
    assert list(make(tmp_path).run([evaluate]).values()) == ["SUCCESS"]


@dataclass(frozen=True)
class Opt:
    lr: object
    schedule: object
    betas: object


def test_versioned_misuse_is_a_clear_error(logs):
    step = ExecutorStep("a", record, Cfg(logs))
    with pytest.raises(ValueError, match="cannot be nested"):
        versioned(versioned(1))
    with pytest.raises(ValueError, match=r"cannot be nested: .*\(at lr\)"):
        versioned({"lr": versioned(0.1)})
    with pytest.raises(ValueError, match="got a InputName: step references count in the version by themselves"):
        versioned(output_path_of(step))
    with pytest.raises(ValueError, match=r"InputName \(at \[1\]\)"):
        versioned([1, step / "x"])
    with pytest.raises(ValueError, match=r"ExecutorStep \(at inner\)"):
        versioned({"inner": step})
    assert ensure_versioned(3) == versioned(3) and ensure_versioned(versioned(3)) == versioned(3)
    nested = Opt(lr=versioned(0.1), schedule={"warmup": versioned(10)}, betas=[versioned(0.9), (versioned(0.95),)])
    assert unwrap_versioned_value(nested) == Opt(lr=0.1, schedule={"warmup": 10}, betas=[0.9, (0.95,)])
    with pytest.raises(ValueError, match="only known when the step runs"):
        unwrap_versioned_value(Cfg(logs, input_path=step))


def test_inputname_forms_agree():
    step = ExecutorStep("a", record, Cfg("/logs"))
    assert InputName(step, "x") == InputName(step=step, subpath="x") == step / "x" == output_path_of(step, "x")
    assert InputName(path="gs://raw", subpath="one") == InputName.hardcoded("gs://raw/one")
    assert (step / "x").block_on_step and not (step / "x").nonblocking().block_on_step
    with pytest.raises(ValueError, match="needs a step or a path"):
        InputName()


def test_relative_hardcoded_path_is_taken_under_the_prefix(tmp_path, logs):
    step = ExecutorStep("r", record, Cfg(logs, input_path=InputName.hardcoded("raw/corpus"), other_path=InputName.hardcoded("/abs/x")))
    make(tmp_path).run([step])
    (call,) = calls(logs)
    assert call["input_path"] == str(tmp_path / "out" / "raw" / "corpus") and call["other_path"] == "/abs/x"


def test_status_file_holds_the_bare_token_and_the_lease_holds_owner_time_and_error(tmp_path, logs):
    from marin.execution import read_status, read_step_record

    def broken(config):
        raise RuntimeError("kaput")

    good = ExecutorStep("good", record, Cfg(logs, versioned(1)))
    bad = ExecutorStep("bad", broken, Cfg(logs, versioned(2)))
    child = ExecutorStep("child", record, Cfg(logs, input_path=bad / "x"))
    with pytest.raises(ExecutorError):
        make(tmp_path).run([good, child])
    paths = {p.name: p.output_path for p in make(tmp_path).plan([good, child]).steps}
    texts = {name: open(f"{path}/.executor_status").read() for name, path in paths.items()}
    assert texts == {"good": "SUCCESS", "bad": "FAILED", "child": "DEP_FAILED"}
    detail = read_step_record(paths["bad"])
    assert detail["status"] == "FAILED" and "RuntimeError: kaput" in detail["error"]
    assert detail["owner"].endswith(f":{os.getpid()}") and detail["time"].startswith("20")
    assert read_step_record(paths["good"])["error"] is None and read_status(paths["child"]).value == "DEP_FAILED"


@pytest.mark.parametrize(
    "legacy, skipped",
    [
        (json.dumps({"status": "SUCCESS", "time": "2025-01-01T00:00:00+00:00", "owner": "old:1"}, indent=2), True),
        ('{"date": "2024-01-01", "status": "RUNNING"}\n{"date": "2024-01-02", "status": "SUCCESS"}\n', True),
        ('{"date": "2024-01-01", "status": "RUNNING"}\n{"date": "2024-01-02", "status": "FAILED"}\n', False),
    ],
    ids=["our-json", "marin-json-lines-success", "marin-json-lines-failed"],
)
def test_status_files_in_the_older_json_forms_are_still_read(tmp_path, logs, legacy, skipped):
    from marin.execution import read_status, read_step_record

    step = ExecutorStep("old", record, Cfg(logs, versioned(1)))
    path = make(tmp_path).plan([step]).steps[0].output_path
    os.makedirs(path)
    with open(f"{path}/.executor_status", "w") as f:
        f.write(legacy)
    if skipped:
        assert read_status(path).value == "SUCCESS"
        assert make(tmp_path).run([step]) == {path: "SKIPPED"} and calls(logs) == []
    else:
        assert read_step_record(path)["status"] == "FAILED"
        with pytest.raises(ExecutorError, match="force_run_failed"):
            make(tmp_path).run([step])
        assert make(tmp_path, force_run_failed=True).run([step]) == {path: "SUCCESS"}
        assert open(f"{path}/.executor_status").read() == "SUCCESS"


def test_executor_main_takes_marin_call_forms(tmp_path, logs):
    step = ExecutorStep("m", record, Cfg(logs, versioned(1)), description="a step with a description")
    info_dir = tmp_path / "records"
    config = ExecutorMainConfig(prefix=str(tmp_path / "out"), executor_info_base_path=str(info_dir))
    first = executor_main(config, steps=[step.as_input_name()])
    assert list(first.values()) == ["SUCCESS"] and len(list(info_dir.glob("*.json"))) == 1
    assert executor_main(config, [step]) == {path: "SKIPPED" for path in first}
    from marin.execution import read_info

    assert read_info(list(first)[0])["description"] == "a step with a description"
    with pytest.raises(TypeError, match="steps twice"):
        executor_main([step], steps=[step])


def test_get_executor_step_gives_the_step_of_a_reference(logs):
    a = ExecutorStep("a", record, Cfg(logs, versioned(1)))
    assert get_executor_step(a) is a and get_executor_step(a / "x") is a and get_executor_step(output_path_of(a).nonblocking()) is a
    with pytest.raises(ValueError, match="hardcoded path 'raw/x' is not a step"):
        get_executor_step(InputName.hardcoded("raw/x"))
    with pytest.raises(ValueError, match="got str"):
        get_executor_step("a")


def test_max_concurrent_none_starts_every_ready_step(tmp_path):
    """Review bug 4: `ExecutorMainConfig(max_concurrent=None)` (Marin's default: no limit)
    crashed on `None < 1`. Twelve steps meet at one barrier, which only works if all twelve
    run at once (more than the default limit of 8)."""
    barrier = threading.Barrier(12, timeout=60)
    steps = [ExecutorStep(f"s{i}", lambda config: config["meet"].wait(), {"i": versioned(i), "meet": barrier}) for i in range(12)]
    config = ExecutorMainConfig(prefix=str(tmp_path / "out"), max_concurrent=None)
    assert list(executor_main(config, steps=steps).values()) == ["SUCCESS"] * 12
    with pytest.raises(ValueError, match="max_concurrent must be at least 1, got 0"):
        Executor(str(tmp_path / "out"), max_concurrent=0)


HELLO_WORLD_SHAPE = '''
"""Two steps, written the way Marin's published hello_world is."""

import json
import os
from dataclasses import dataclass

import fsspec

from marin.execution.executor import ExecutorStep, executor_main, output_path_of, this_output_path


@dataclass(frozen=True)
class MakeNumbersConfig:
    n: int
    output_path: str


def make_numbers(config: MakeNumbersConfig):
    with fsspec.open(os.path.join(config.output_path, "numbers.json"), "w") as f:
        json.dump(list(range(config.n)), f)


@dataclass(frozen=True)
class SummarizeConfig:
    input_path: str
    output_path: str


def summarize(config: SummarizeConfig):
    with fsspec.open(os.path.join(config.input_path, "numbers.json")) as f:
        numbers = json.load(f)
    with fsspec.open(os.path.join(config.output_path, "stats.json"), "w") as f:
        json.dump({"sum": sum(numbers), "min": min(numbers), "max": max(numbers)}, f)


n = 100

numbers = ExecutorStep(
    name="hello_world/data",
    description=f"Numbers 0 to {n} - 1.",
    fn=make_numbers,
    config=MakeNumbersConfig(n=n, output_path=this_output_path()),
)

stats = ExecutorStep(
    name="hello_world/stats",
    description="Sum, min and max of the numbers.",
    fn=summarize,
    config=SummarizeConfig(input_path=output_path_of(numbers), output_path=this_output_path()),
)

if __name__ == "__main__":
    executor_main(
        steps=[numbers, stats],
        description="Compute statistics of some numbers.",
    )
'''


@pytest.mark.slow
def test_an_experiment_shaped_like_marins_hello_world_runs_unchanged(tmp_path):
    script = tmp_path / "hello_world.py"
    script.write_text(textwrap.dedent(HELLO_WORLD_SHAPE))
    prefix = tmp_path / "prefix"

    def run():
        env = dict(os.environ, MARIN_PREFIX=str(prefix))
        proc = subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    first = run()
    assert "Running step hello_world/data" in first and "Running step hello_world/stats" in first
    (stats_dir,) = (prefix / "hello_world").glob("stats-*")
    assert json.loads((stats_dir / "stats.json").read_text()) == {"sum": 4950, "min": 0, "max": 99}
    assert (stats_dir / ".executor_status").read_text() == "SUCCESS"
    info = json.loads((stats_dir / ".executor_info").read_text())
    assert info["description"] == "Sum, min and max of the numbers."
    (record,) = (prefix / "experiments").glob("hello_world-*.json")
    assert json.loads(record.read_text())["description"] == "Compute statistics of some numbers."
    second = run()
    assert "Running step" not in second and second.count("already succeeded") == 2
