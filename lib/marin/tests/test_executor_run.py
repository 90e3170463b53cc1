"""Running experiments on local disk: skip, force, run_only, dry_run, dedup, failures, limits."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from marin.execution import (
    SKIPPED,
    Executor,
    ExecutorError,
    ExecutorMainConfig,
    ExecutorStep,
    StepStatus,
    executor_main,
    output_path_of,
    read_info,
    read_status,
    read_step_record,
    this_output_path,
    versioned,
)
from marin.execution.main import PREFIX_SOURCE_ENV


@dataclass(frozen=True)
class Cfg:
    log_dir: str
    value: object = 0
    input_path: object = None
    output_path: object = None
    fail: bool = False
    sleep: float = 0.0


def record(config: Cfg) -> None:
    """Leave one file per call in log_dir (so tests count runs), copy input, maybe fail."""
    if config.sleep:
        time.sleep(config.sleep)
    with open(os.path.join(config.log_dir, f"{os.getpid()}-{uuid.uuid4().hex}"), "w") as f:
        f.write(str(config.output_path))
    if config.fail:
        raise RuntimeError(f"boom in {config.output_path}")
    previous = 0
    if config.input_path:
        with open(config.input_path) as f:
            previous = json.load(f)["total"]
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "out.json"), "w") as f:
        json.dump({"total": previous + config.value}, f)


def runs(log_dir) -> list[str]:
    return sorted(open(os.path.join(log_dir, name)).read() for name in os.listdir(log_dir))


@pytest.fixture
def logs(tmp_path):
    path = tmp_path / "logs"
    path.mkdir()
    return str(path)


def chain(logs, a_value=1, b_value=2, a_fail=False):
    a = ExecutorStep("a", record, Cfg(logs, versioned(a_value), output_path=this_output_path(), fail=a_fail))
    b = ExecutorStep("b", record, Cfg(logs, versioned(b_value), output_path_of(a, "out.json"), this_output_path()))
    c = ExecutorStep("c", record, Cfg(logs, versioned(3), output_path_of(b, "out.json"), this_output_path()))
    return a, b, c


def make(tmp_path, **kwargs) -> Executor:
    kwargs.setdefault("poll_interval", 0.05)
    return Executor(str(tmp_path / "out"), caller="exp.py", **kwargs)


def test_runs_in_order_then_skips(tmp_path, logs):
    a, b, c = chain(logs)
    first = make(tmp_path).run([c])
    assert list(first.values()) == ["SUCCESS"] * 3
    with open(os.path.join(list(first)[2], "out.json")) as f:
        assert json.load(f) == {"total": 6}
    assert make(tmp_path).run([c]) == {path: SKIPPED for path in first}
    assert len(runs(logs)) == 3


def test_changing_a_versioned_field_reruns_exactly_affected_steps(tmp_path, logs):
    make(tmp_path).run([chain(logs)[2]])
    second = make(tmp_path).run([chain(logs, b_value=5)[2]])
    assert list(second.values()) == [SKIPPED, "SUCCESS", "SUCCESS"]
    assert len(runs(logs)) == 5


def test_status_info_and_experiment_record(tmp_path, logs):
    a, b, _ = chain(logs)
    result = make(tmp_path, description="demo").run([b])
    a_path, b_path = list(result)
    assert read_status(b_path) == StepStatus.SUCCESS
    info = read_info(b_path)
    assert info["name"] == "b" and info["dependencies"] == [a_path]
    assert info["config"]["input_path"] == f"{a_path}/out.json" and info["config"]["value"] == 2
    assert info["version"]["config"]["value"] == 2 and b_path.endswith(info["hash"])
    assert info["fn"].endswith("record")
    (record_file,) = (tmp_path / "out" / "experiments").iterdir()
    experiment = json.loads(record_file.read_text())
    assert record_file.name.startswith("exp-") and experiment["description"] == "demo"
    assert [s["state"] for s in experiment["steps"]] == ["SUCCESS", "SUCCESS"] and experiment["date"]
    assert "git_commit" in experiment and experiment["caller"].endswith("exp.py")


def test_identical_steps_run_once(tmp_path, logs):
    _, _, c1 = chain(logs)
    _, _, c2 = chain(logs)
    assert len(make(tmp_path).run([c1, c2])) == 3
    assert len(runs(logs)) == 3


def test_failure_marks_dependents_and_lists_failed_steps(tmp_path, logs):
    a, b, c = chain(logs, a_fail=True)
    other = ExecutorStep("independent", record, Cfg(logs, versioned(9), output_path=this_output_path()))
    with pytest.raises(ExecutorError) as info:
        make(tmp_path).run([c, other])
    plan = make(tmp_path).plan([c, other])
    a_path, b_path, c_path, other_path = (p.output_path for p in plan.steps)
    assert list(info.value.failed) == [a_path] and "boom" in str(info.value) and a_path in str(info.value)
    assert info.value.dep_failed == [b_path, c_path]
    assert read_status(a_path) == StepStatus.FAILED and "RuntimeError" in read_step_record(a_path)["error"]
    assert read_status(b_path) == read_status(c_path) == StepStatus.DEP_FAILED
    assert read_status(other_path) == StepStatus.SUCCESS  # independent work still finished

    # A previously failed step raises without --force_run_failed, and is not rerun.
    with pytest.raises(ExecutorError, match="force_run_failed"):
        make(tmp_path).run([c])
    assert len(runs(logs)) == 2

    # With force (and the bug fixed: fail is not versioned) it reruns, and so do dependents.
    fixed_a, _, fixed_c = chain(logs)
    assert fixed_a is not a and make(tmp_path).plan([fixed_c]).steps[0].output_path == a_path
    result = make(tmp_path, force_run_failed=True).run([fixed_c])
    assert list(result.values()) == ["SUCCESS"] * 3


def test_a_step_that_failed_on_its_own_keeps_failed_when_a_dependency_fails_later(tmp_path, logs):
    import shutil

    def steps(a_fail: bool, b_fail: bool):
        a = ExecutorStep("a", record, Cfg(logs, versioned(1), output_path=this_output_path(), fail=a_fail))
        b = ExecutorStep("b", record, Cfg(logs, versioned(2), output_path_of(a, "out.json"), this_output_path(), fail=b_fail))
        return a, b

    with pytest.raises(ExecutorError):
        make(tmp_path).run([steps(a_fail=False, b_fail=True)[1]])  # b fails on its own
    a_path, b_path = (p.output_path for p in make(tmp_path).plan([steps(False, True)[1]]).steps)
    assert read_status(b_path) == StepStatus.FAILED
    shutil.rmtree(a_path)  # a is recomputed, and fails this time (fail is not versioned: same paths)
    with pytest.raises(ExecutorError) as info:
        make(tmp_path).run([steps(a_fail=True, b_fail=False)[1]])
    assert info.value.dep_failed == [b_path]  # this run reports b as blocked ...
    assert read_status(b_path) == StepStatus.FAILED  # ... but its own failure stays on record
    make(tmp_path, force_run_failed=True).run([steps(a_fail=False, b_fail=False)[0]])  # a fixed, alone
    before = len(runs(logs))
    with pytest.raises(ExecutorError, match="force_run_failed"):  # b still needs the flag
        make(tmp_path).run([steps(a_fail=False, b_fail=False)[1]])
    assert len(runs(logs)) == before  # b did not run
    assert "boom" in read_step_record(b_path)["error"]


def test_the_last_error_survives_a_later_lease_released_without_an_outcome(tmp_path, logs):
    from marin.execution.status import LEASE_DIR
    from zephyr.io.lease import Lease

    a, _, _ = chain(logs, a_fail=True)
    with pytest.raises(ExecutorError):
        make(tmp_path).run([a])
    a_path = make(tmp_path).plan([a]).steps[0].output_path
    assert "boom" in read_step_record(a_path)["error"]
    # another executor takes the lease, finds the step failed, and lets go without an outcome
    other = Lease(f"{a_path}/{LEASE_DIR}", "other-executor", timeout=30, heartbeat_interval=5)
    assert other.try_acquire()
    other.release()
    assert Lease(f"{a_path}/{LEASE_DIR}").current()["owner"] == "other-executor"  # the fault landed
    found = read_step_record(a_path)
    assert found["status"] == StepStatus.FAILED and "boom" in found["error"] and found["owner"] != "other-executor"


def test_an_overridden_path_made_by_another_version_is_kept_with_a_warning(tmp_path, logs, caplog):
    def step(value):
        return ExecutorStep("a", record, Cfg(logs, versioned(value), output_path=this_output_path()),
                            override_output_path="fixed/a")

    make(tmp_path).run([step(1)])
    with caplog.at_level(logging.WARNING, logger="marin.execution.runner"):
        assert list(make(tmp_path).run([step(1)]).values()) == [SKIPPED]
        assert "another version" not in caplog.text  # same version: skipped quietly
        assert list(make(tmp_path).run([step(2)]).values()) == [SKIPPED]  # as in Marin: the path decides
    assert len(runs(logs)) == 1
    (warning,) = [r.getMessage() for r in caplog.records if "another version" in r.getMessage()]
    assert str(tmp_path / "out" / "fixed" / "a") in warning and "Remove it" in warning


def test_run_only_runs_selection_and_dependencies(tmp_path, logs):
    _, _, c = chain(logs)
    result = make(tmp_path).run([c], run_only=["^b$"])
    assert [os.path.basename(p).split("-")[0] for p in result] == ["a", "b"]
    assert len(runs(logs)) == 2


def test_dry_run_reports_actions_and_writes_nothing(tmp_path, logs):
    a, b, c = chain(logs)
    lines: list[str] = []
    actions = make(tmp_path).dry_run([c], out=lines.append)
    assert list(actions.values()) == ["run", "wait", "wait"]
    assert not (tmp_path / "out").exists() and runs(logs) == []
    assert lines[0].split()[0:2] == ["run", "a"] and lines[0].split()[2] == list(actions)[0]

    make(tmp_path).run([a])
    assert list(make(tmp_path).dry_run([c], out=lines.append).values()) == ["skip", "run", "wait"]

    bad_a, _, bad_c = chain(logs, a_value=7, a_fail=True)
    with pytest.raises(ExecutorError):
        make(tmp_path).run([bad_a])
    assert list(make(tmp_path).dry_run([bad_c], out=lines.append).values()) == ["fail", "blocked", "blocked"]


def test_executor_main_parses_flags(tmp_path, logs, capsys):
    _, _, c = chain(logs)
    prefix = str(tmp_path / "cli")
    actions = executor_main([c], args=["--prefix", prefix, "--dry_run", "true", "--run_only", '["^a$"]'])
    assert list(actions.values()) == ["run"] and "run" in capsys.readouterr().out
    result = executor_main([c], config=ExecutorMainConfig(prefix=prefix, max_concurrent=1))
    assert list(result.values()) == ["SUCCESS"] * 3
    os.environ["MARIN_PREFIX"] = prefix
    try:
        assert set(executor_main([c], args=[]).values()) == {SKIPPED}
    finally:
        del os.environ["MARIN_PREFIX"]
    with pytest.raises(ValueError, match="MARIN_PREFIX"):
        executor_main([c], args=[])


def test_prefix_over_the_clusters_marin_prefix_is_said_without_a_warning(tmp_path, logs, monkeypatch, caplog):
    """Regression (issue 38): a job that `ray_run` submitted with `--prefix` warned that it
    differed from MARIN_PREFIX, which the cluster had set, not the user; a MARIN_PREFIX the
    user set (no PREFIX_SOURCE_ENV) still gets the warning."""
    _, _, c = chain(logs)
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "cluster-default"))
    monkeypatch.setenv(PREFIX_SOURCE_ENV, "cluster")
    caplog.set_level(logging.INFO, logger="marin")
    args = ["--prefix", str(tmp_path / "mine"), "--dry_run", "true"]
    executor_main([c], args=args)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "MARIN_PREFIX" in r.getMessage()]
    assert said == [(logging.INFO, f"writing under --prefix {tmp_path / 'mine'} (the cluster's default, MARIN_PREFIX, "
                                   f"is {tmp_path / 'cluster-default'})")]
    caplog.clear()
    monkeypatch.delenv(PREFIX_SOURCE_ENV)
    executor_main([c], args=args)
    assert [r.levelno for r in caplog.records if "differs from MARIN_PREFIX" in r.getMessage()] == [logging.WARNING]


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--lease_timeout", "5"], "got --lease_timeout 5.0 --heartbeat_interval 10.0"),
     (["--heartbeat_interval", "0"], "got --lease_timeout 60.0 --heartbeat_interval 0.0"),
     (["--poll_interval", "0"], "poll_interval must be > 0 seconds, got 0.0")],
)  # fmt: skip
def test_bad_lease_flags_are_refused_before_anything_runs(tmp_path, logs, flags, message):
    """Regression: `--lease_timeout 5` (below the default heartbeat of 10 s) failed inside the
    first step's thread; the run then crashed marking its dependent DEP_FAILED, the error naming
    neither the flag nor the step, and the experiment record said every step was PENDING."""
    _, _, c = chain(logs)
    prefix = tmp_path / "cli"
    with pytest.raises(ValueError, match=re.escape(message)):
        executor_main([c], args=["--prefix", str(prefix), *flags])
    assert runs(logs) == [] and not prefix.exists()


def test_concurrency_is_bounded_by_max_concurrent(tmp_path):
    active, peak, lock = [0], [0], threading.Lock()

    def slow(config):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1

    steps = [ExecutorStep(f"s{i}", slow, {"i": versioned(i)}) for i in range(6)]
    make(tmp_path, max_concurrent=3).run(steps)
    assert peak[0] == 3  # three at once (not timed: a loaded machine makes any duration plausible)


@dataclass(frozen=True)
class CrashCfg:
    marker: str
    output_path: object = None


def crash_if_marked(config: CrashCfg) -> None:
    """Raises a fake Ray 'worker died' error while the marker file exists."""
    from ray.exceptions import WorkerCrashedError

    if os.path.exists(config.marker):
        raise WorkerCrashedError()
    os.makedirs(config.output_path, exist_ok=True)


def test_lost_node_is_recorded_preempted_and_reruns(tmp_path):
    """Bug 5: a step whose Ray task's node/worker died was recorded FAILED, so a rerun
    refused it without --force_run_failed. Now it is PREEMPTED and a plain rerun runs it."""
    marker = tmp_path / "crash"
    marker.write_text("")
    step = ExecutorStep("crashy", crash_if_marked, CrashCfg(str(marker), this_output_path()))
    with pytest.raises(ExecutorError):
        make(tmp_path).run([step])
    (path,) = [p.output_path for p in make(tmp_path).plan([step]).steps]
    assert read_status(path) == StepStatus.PREEMPTED
    assert make(tmp_path).dry_run([step], out=lambda line: None) == {path: "run"}
    marker.unlink()
    assert make(tmp_path).run([step]) == {path: "SUCCESS"}


def take_over_own_lease(config: CrashCfg) -> None:
    """Plays another executor taking this step's lease over mid-run (a newer epoch's claim)."""
    lease_dir = os.path.join(config.output_path, ".executor_lease")
    claim = {"owner": "other:1", "token": "f" * 32, "epoch": 2, "heartbeat": time.time(), "timeout": 60.0}
    with open(os.path.join(lease_dir, "claim-00000002.json"), "w") as f:
        json.dump(claim, f)
    time.sleep(2.0)  # many heartbeats (every 0.05 s), even on a loaded machine: ours notices the newer claim


def test_step_that_lost_its_lease_does_not_write_success(tmp_path):
    """Bug 10 (a): a step that lost its lease still wrote SUCCESS over the new holder's run."""
    step = ExecutorStep("taken", take_over_own_lease, CrashCfg("", this_output_path()))
    executor = make(tmp_path, lease_timeout=1.0, heartbeat_interval=0.05)
    with pytest.raises(ExecutorError, match="lost its lease"):
        executor.run([step])
    (path,) = [p.output_path for p in executor.plan([step]).steps]
    assert read_status(path) == StepStatus.RUNNING


def test_dep_failed_not_written_over_a_live_holder(tmp_path, logs):
    """Bug 10 (c): DEP_FAILED was written without the lease, over the status of a step that
    another executor was running at that moment."""
    from marin.execution import Lease

    a, b, _ = chain(logs, a_fail=True)
    executor = make(tmp_path)
    a_path, b_path = [p.output_path for p in executor.plan([b]).steps]
    other = Lease(f"{b_path}/.executor_lease", "other:1", timeout=30, heartbeat_interval=1)
    assert other.try_acquire()
    try:
        from marin.execution.status import write_status

        write_status(b_path, StepStatus.RUNNING)
        with pytest.raises(ExecutorError):
            executor.run([b])
        assert read_status(b_path) == StepStatus.RUNNING
    finally:
        other.release()
    with pytest.raises(ExecutorError):
        make(tmp_path, force_run_failed=True).run([b])
    assert read_status(b_path) == StepStatus.DEP_FAILED  # no live holder: marked as before


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("force", [True, False])
def test_old_failure_while_another_executor_reruns_waits_for_it(tmp_path, logs, monkeypatch, force):
    """Review bug 1 (a): the status says FAILED (an earlier run); executor B claims the next
    lease epoch but has not written RUNNING yet (on object stores it first sleeps `settle`).
    This executor took "a newer epoch + FAILED" for a failure during this run and raised,
    although B was alive. Now it waits for B and skips the step when B succeeds."""
    from marin.execution import Lease
    from marin.execution import runner
    from marin.execution.status import write_status

    failing = ExecutorStep("flaky", record, Cfg(logs, versioned(1), output_path=this_output_path(), fail=True))
    with pytest.raises(ExecutorError):
        make(tmp_path).run([failing])  # lease epoch 1, released with outcome FAILED
    fixed = ExecutorStep("flaky", record, Cfg(logs, versioned(1), output_path=this_output_path()))  # same path
    (path,) = [p.output_path for p in make(tmp_path).plan([fixed]).steps]
    b = Lease(f"{path}/.executor_lease", "b:1", timeout=30, heartbeat_interval=1)
    reads = []
    real_read_status = runner.read_status

    def read_status_playing_b(output_path):
        reads.append(output_path)
        if len(reads) == 1:  # just after this executor's first look at the lease: B claims epoch 2
            assert b.try_acquire() and b.epoch == 2
        elif len(reads) == 3:  # this executor is waiting on B; B finishes the step
            write_status(path, StepStatus.SUCCESS)
            b.release(outcome=StepStatus.SUCCESS.value)
        return real_read_status(output_path)

    monkeypatch.setattr(runner, "read_status", read_status_playing_b)
    try:
        assert make(tmp_path, force_run_failed=force).run([fixed]) == {path: SKIPPED}
    finally:
        b.release()
    assert len(reads) == 3 and len(runs(logs)) == 1  # only the original failing run


@dataclass(frozen=True)
class GateCfg:
    gate: str
    log_dir: str
    output_path: object = None


def fail_when_gate_opens(config: GateCfg) -> None:
    """Logs a run, waits until the gate file exists, then fails."""
    with open(os.path.join(config.log_dir, uuid.uuid4().hex), "w") as f:
        f.write(str(config.output_path))
    _wait_for(lambda: os.path.exists(config.gate), "the gate")
    raise RuntimeError("boom behind the gate")


def test_failure_in_an_executor_that_held_the_step_at_our_first_look_is_not_rerun(tmp_path, logs, caplog):
    """Review bug 1 (b): executor B already held lease epoch E when this one started, then
    failed. "Newer epoch than the first look" missed that, so the failure counted as one
    from a previous run and --force_run_failed reran the step. Now the lease record of E
    (released with outcome FAILED after the first look) stops this run too."""
    caplog.set_level(logging.INFO, logger="marin.execution.runner")
    gate = tmp_path / "gate"
    step = ExecutorStep("held", fail_when_gate_opens, GateCfg(str(gate), logs, this_output_path()))
    (path,) = [p.output_path for p in make(tmp_path).plan([step]).steps]
    pool = ThreadPoolExecutor(2)
    try:
        b_run = pool.submit(make(tmp_path).run, [step])
        _wait_for(lambda: read_status(path) == StepStatus.RUNNING, "B to run the step")
        a_run = pool.submit(make(tmp_path, force_run_failed=True).run, [step])
        _wait_for(lambda: "is held by" in caplog.text, "this executor to wait on B")
        gate.write_text("")
        with pytest.raises(ExecutorError, match="boom behind the gate"):
            b_run.result(timeout=60)
        with pytest.raises(ExecutorError, match="while this one waited"):
            a_run.result(timeout=60)
    finally:
        gate.write_text("")
        pool.shutdown(wait=True)
    assert len(runs(logs)) == 1


def test_dep_failed_step_runs_without_force_once_its_dependency_succeeded(tmp_path, logs):
    """The documented choice (docs/executor.md, differs from Marin): DEP_FAILED says the step
    never ran, so it is not refused like FAILED; it runs when its dependency has succeeded."""
    a, b, _ = chain(logs, a_fail=True)
    with pytest.raises(ExecutorError):
        make(tmp_path).run([b])
    a_path, b_path = [p.output_path for p in make(tmp_path).plan([b]).steps]
    assert read_status(b_path) == StepStatus.DEP_FAILED
    fixed_a, fixed_b, _ = chain(logs)
    assert make(tmp_path, force_run_failed=True).run([fixed_a]) == {a_path: "SUCCESS"}
    assert make(tmp_path).run([fixed_b]) == {a_path: SKIPPED, b_path: "SUCCESS"}
