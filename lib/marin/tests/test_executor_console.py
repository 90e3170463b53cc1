"""What the executor tells the user (issue 24): a failed step's own traceback on the console, and
`marin steps` listing an experiment's steps with status, output path and last error."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import pytest

from marin.cli import main as marin_main
from marin.execution import Executor, ExecutorError, ExecutorStep, output_path_of, this_output_path, versioned


@dataclass(frozen=True)
class Cfg:
    value: object = 0
    input_path: object = None
    output_path: object = None
    fail: bool = False


def parse_record_line(config: Cfg) -> None:
    """The user's step: fails inside a helper of its own when told to."""
    if config.fail:
        _reject(config.value)
    os.makedirs(config.output_path, exist_ok=True)


def _reject(value) -> None:
    raise ValueError(f"record {value} has no text field")


def _experiment(tmp_path, fail: bool):
    a = ExecutorStep("tokenize", parse_record_line, Cfg(versioned(1), output_path=this_output_path(), fail=fail))
    b = ExecutorStep("train", parse_record_line, Cfg(versioned(2), output_path_of(a), this_output_path()))
    other = ExecutorStep("stats", parse_record_line, Cfg(versioned(3), output_path=this_output_path()))
    executor = Executor(str(tmp_path / "prefix"), caller="exp.py", poll_interval=0.05)
    return executor, [b, other]


def test_failed_step_puts_the_users_traceback_on_the_console(tmp_path, caplog):
    """Regression (issue 24): the console showed one line; the user's frames were only escaped
    JSON in the step's lease file."""
    caplog.set_level(logging.INFO, logger="marin.execution.runner")
    executor, steps = _experiment(tmp_path, fail=True)
    with pytest.raises(ExecutorError):
        executor.run(steps)
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "Step tokenize failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    # the user's own frames, innermost last, as Python prints them
    assert "in parse_record_line" in failed[0] and "in _reject" in failed[0]
    assert 'raise ValueError(f"record {value} has no text field")' in failed[0]
    assert failed[0].rstrip().endswith("ValueError: record 1 has no text field")


def _root_cause_helper() -> None:
    raise ValueError("cannot parse " + "lorem ipsum " * 500)


def parse_with_a_long_cause(config: Cfg) -> None:
    try:
        _root_cause_helper()
    except ValueError as e:
        raise RuntimeError("could not parse record") from e


def test_a_long_traceback_keeps_its_root_cause_on_the_console_and_in_the_lease(tmp_path, caplog, capsys):
    """Regression: the traceback was cut to its last 4,000 characters for the console and the
    lease alike, so a chained exception with a long message lost its root cause (printed first)."""
    caplog.set_level(logging.INFO, logger="marin.execution.runner")
    step = ExecutorStep("parse", parse_with_a_long_cause, Cfg(versioned(1), output_path=this_output_path()))
    with pytest.raises(ExecutorError):
        Executor(str(tmp_path / "prefix"), caller="exp.py", poll_interval=0.05).run([step])
    (failed,) = [r.getMessage() for r in caplog.records if "Step parse failed" in r.getMessage()]
    assert "in _root_cause_helper" in failed and "ValueError: cannot parse lorem" in failed  # the whole traceback
    assert failed.rstrip().endswith("RuntimeError: could not parse record")
    capsys.readouterr()
    record = next((tmp_path / "prefix" / "experiments").glob("exp-*.json"))
    assert marin_main(["steps", str(record), "--traceback"]) == 0
    kept = capsys.readouterr().out
    assert "in _root_cause_helper" in kept and "characters cut" in kept and "RuntimeError: could not parse record" in kept


def _table(text: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\s+([A-Z_ ]+?)\s+(/\S+)$", line)
        if m and m.group(1) != "STEP":
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_marin_steps_lists_status_output_and_last_error(tmp_path, capsys):
    """Regression (issue 24): no command showed a step's status and error."""
    executor, steps = _experiment(tmp_path, fail=True)
    with pytest.raises(ExecutorError) as info:
        executor.run(steps)
    assert f"marin steps {tmp_path / 'prefix' / 'experiments'}/exp-" in str(info.value)  # the error says where to look
    plan = {p.name: p.output_path for p in executor.plan(steps).steps}
    capsys.readouterr()
    assert marin_main(["steps", str(tmp_path / "prefix")]) == 0
    out = capsys.readouterr().out
    expected = {"tokenize": ("FAILED", plan["tokenize"]), "train": ("DEP_FAILED", plan["train"]),
                "stats": ("SUCCESS", plan["stats"])}
    assert _table(out) == expected
    assert "    last error: ValueError: record 1 has no text field" in out.splitlines()

    record = next((tmp_path / "prefix" / "experiments").glob("exp-*.json"))
    assert marin_main(["steps", str(record), "--traceback"]) == 0
    full = capsys.readouterr().out
    assert "in _reject" in full and _table(full) == expected


def test_marin_steps_from_another_directory_after_a_run_with_a_relative_prefix(tmp_path, capsys, monkeypatch):
    """Regression: `--prefix scratch/x` (the quickstart's default is relative too) recorded
    relative output paths, so `marin steps` run from any other directory read no status file and
    listed every step NOT STARTED. The oracle is what the run itself did: each step's status file
    under the prefix."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    steps = [ExecutorStep("stats", parse_record_line, Cfg(versioned(3), output_path=this_output_path()))]
    Executor("rel/prefix", caller="exp.py", poll_interval=0.05).run(steps)
    (status_file,) = (run_dir / "rel" / "prefix").glob("stats-*/.executor_status")
    assert status_file.read_text().strip() == "SUCCESS"
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert marin_main(["steps", str(run_dir / "rel" / "prefix")]) == 0
    assert _table(capsys.readouterr().out) == {"stats": ("SUCCESS", str(status_file.parent))}


def test_marin_steps_on_a_prefix_without_records_says_so(tmp_path, capsys):
    assert marin_main(["steps", str(tmp_path)]) == 1
    assert f"no experiment record under {tmp_path}/experiments/" in capsys.readouterr().err


def count_words(config: Cfg) -> None:
    """A step that runs a Zephyr pipeline, as the quickstart's do."""
    from zephyr import Dataset, create_backend

    ds = Dataset.from_list(["a b", "c"]).map(lambda t: {"n": len(t.split())}).write_jsonl(f"{config.output_path}/{{shard}}.jsonl")
    list(create_backend("sync", progress=False).execute(ds))


def test_the_status_of_a_steps_pipeline_names_the_step(tmp_path):
    """Regression (issue 24): the status page of a pipeline run by an executor step did not say which step."""
    from zephyr.status import format_snapshot, read_run_record, runs

    step = ExecutorStep("wordcount", count_words, Cfg(versioned(1), output_path=this_output_path()))
    executor = Executor(str(tmp_path / "prefix"), caller="exp.py", poll_interval=0.05)
    [path] = executor.run([step])
    record = read_run_record(path)
    assert record["label"] == "executor step wordcount"
    assert [r.summary()["label"] for r in runs() if r.record_path == record["record_path"]] == ["executor step wordcount"]
    assert format_snapshot(record).splitlines()[0].endswith(", for executor step wordcount")


def test_marin_steps_on_a_prefix_named_with_brackets(tmp_path, capsys):
    """Regression: the records were found by a glob over the prefix, which read `pre[1]` as a
    pattern: "no experiment record" for a prefix that has one."""
    step = ExecutorStep("stats", parse_record_line, Cfg(versioned(3), output_path=this_output_path()))
    prefix = tmp_path / "pre[1]"
    executor = Executor(str(prefix), caller="exp.py", poll_interval=0.05)
    executor.run([step])
    capsys.readouterr()
    assert marin_main(["steps", str(prefix)]) == 0
    assert _table(capsys.readouterr().out) == {"stats": ("SUCCESS", executor.plan([step]).steps[0].output_path)}
