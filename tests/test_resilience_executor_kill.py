"""An executor experiment killed mid-step: the same command finishes it, without redoing the
step that had already succeeded."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.resilience, pytest.mark.slow]

EXPERIMENT = textwrap.dedent(
    """
    import os, time
    from dataclasses import dataclass
    from marin.execution import ExecutorStep, executor_main, output_path_of, this_output_path, versioned

    CALLS = os.environ["CALLS_DIR"]

    @dataclass(frozen=True)
    class Config:
        output_path: str
        size: int = 3
        upstream: str | None = None

    def note(name):
        open(os.path.join(CALLS, f"{name}-{time.monotonic_ns()}"), "w").close()

    def produce(config):
        note("produce")
        with open(os.path.join(config.output_path, "numbers.txt"), "w") as f:
            f.write(" ".join(str(i) for i in range(config.size)))

    def consume(config):
        note("consume")
        time.sleep(float(os.environ.get("CONSUME_SECONDS", "0")))
        numbers = open(os.path.join(config.upstream, "numbers.txt")).read().split()
        with open(os.path.join(config.output_path, "total.txt"), "w") as f:
            f.write(str(sum(map(int, numbers))))

    produced = ExecutorStep(name="produce", fn=produce, config=Config(this_output_path(), versioned(5)))
    consumed = ExecutorStep(name="consume", fn=consume, config=Config(this_output_path(), upstream=output_path_of(produced)))

    if __name__ == "__main__":
        executor_main([produced, consumed])
    """
)


def test_experiment_killed_mid_step_finishes_on_rerun(tmp_path, background):
    script = tmp_path / "experiment.py"
    script.write_text(EXPERIMENT)
    calls = tmp_path / "calls"
    calls.mkdir()
    prefix = tmp_path / "prefix"
    args = [sys.executable, str(script), "--prefix", str(prefix), "--lease_timeout", "3", "--heartbeat_interval", "0.5", "--poll_interval", "0.5"]
    env = {**os.environ, "CALLS_DIR": str(calls)}
    proc = background(args, env={**env, "CONSUME_SECONDS": "600"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not any(p.name.startswith("consume") for p in calls.iterdir()):
        assert proc.poll() is None, f"the experiment ended before its step ran: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "waited 300s for the `consume` step to start"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the driver dies while `consume` runs
    assert proc.wait() == -signal.SIGKILL, "the experiment exited before the kill"
    [consume_dir] = list(prefix.glob("consume-*"))
    assert "RUNNING" in (consume_dir / ".executor_status").read_text()

    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (consume_dir / "total.txt").read_text() == "10"
    assert "SUCCESS" in (consume_dir / ".executor_status").read_text()
    made = sorted(p.name.split("-")[0] for p in calls.iterdir())
    assert made == ["consume", "consume", "produce"]  # produce ran once; consume was finished by the rerun
