"""End to end on the `local` cluster: a real token-auth Ray head on this machine.

One head is started for the module (through the `marin` console script). The tests submit a
Zephyr script with `ray_run`, list it, read its logs, stop a long job, refuse a client without
the token; the restart test restarts (with job preservation) and stops a cluster of its own.
Every output is checked for the token.

Isolation on a shared, loaded machine: each cluster lives in its own state dir and HOME on
ports chosen free; every job a test submits is stopped in a finalizer, and every cluster is
stopped in one, so that a failure never leaks a running job or a head into the next test.
Deadlines are sized for a loaded 2-core machine and every wait says what it waited for.
"""

from __future__ import annotations

import contextlib
import json
import re
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from zephyr import cli as zephyr_cli
from zephyr.io.temporaries import process_alive

from marin.cluster import cli, local, procfs
from marin.cluster.auth import auth_headers
from marin.run import ray_run

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# Deadline for one CLI command or job (a job starts a Ray driver, and Zephyr jobs Ray workers:
# tens of seconds on a loaded 2-core machine).
COMMAND_TIMEOUT = 300
START_TIMEOUT = local._START_TIMEOUT + 60

BIN = Path(sys.executable).parent
ZEPHYR_JOB = """
from zephyr import Dataset, create_backend

backend = create_backend("ray", max_parallelism=2)
pipeline = Dataset.from_list(list(range(100))).map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
result = sorted(backend.execute(pipeline))
print("ZEPHYR_RESULT", len(result), sum(result), flush=True)
"""
RAY_JOB = """
import ray

ray.init()

@ray.remote
def double(x):
    return 2 * x

print("RAY_RESULT", sum(ray.get([double.remote(i) for i in range(10)])), flush=True)
"""
LONG_JOB = """
import os, time
print("LONG_JOB_STARTED", os.environ.get("MARK"), flush=True)
while True:
    time.sleep(0.5)
"""


class Env:
    """The isolated environment of the module's cluster, and every output seen so far."""

    def __init__(self, base: Path):
        self.state = base / "state"
        self.work = base / "work"
        self.vars = {
            "MARIN_LOCAL_CLUSTER_DIR": str(self.state),
            "HOME": str(base / "home"),
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }
        self.outputs: list[str] = []

    @property
    def token(self) -> str:
        return local.token_path(self.state).read_text().strip()

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        full_env |= self.vars | (env or {})
        result = subprocess.run(argv, cwd=self.work, env=full_env, capture_output=True, text=True, timeout=timeout)
        self.outputs.append(result.stdout + result.stderr)
        return result

    def cli(self, capfd, *args: str) -> tuple[int, str]:
        code = cli.main(list(args))
        captured = capfd.readouterr()
        self.outputs.append(captured.out + captured.err)
        return code, captured.out + captured.err

    def assert_token_never_shown(self) -> None:
        token = self.token
        assert len(token) >= 16
        for text in self.outputs:
            assert token not in text


def _write_jobs(work: Path) -> None:
    work.mkdir(parents=True)
    (work / "zephyr_job.py").write_text(textwrap.dedent(ZEPHYR_JOB))
    (work / "ray_job.py").write_text(textwrap.dedent(RAY_JOB))
    (work / "long_job.py").write_text(textwrap.dedent(LONG_JOB))


@contextlib.contextmanager
def _running_cluster(base: Path):
    """Start a local cluster in `base` through the console script; stop it however the block ends."""
    env = Env(base)
    _write_jobs(env.work)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.vars.items():
            mp.setenv(key, value)
        for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MARIN_CLUSTER"):
            mp.delenv(key, raising=False)
        try:
            # longer than the start deadline of marin.cluster.local, so that its own message shows
            started = env.run(str(BIN / "marin"), "cluster", "--cluster", "local", "start-cluster", timeout=START_TIMEOUT)
            assert started.returncode == 0, f"start-cluster failed:\n{started.stderr[-3000:]}"
            yield env
        finally:
            local.stop(env.state)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with _running_cluster(tmp_path_factory.mktemp("local-cluster")) as env:
        yield env


@pytest.fixture
def jobs_stopped_after(cluster):
    """After the test, every job still pending or running on the module's cluster is stopped
    (and waited for), so that a failed test never leaks a running job into the next one."""
    yield
    running = local.load(cluster.state)
    if running is None:
        return
    token = cluster.token
    request = urllib.request.Request(f"{running.dashboard_url}/api/jobs/", headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=30) as response:
        active = [job["submission_id"] for job in json.load(response)
                  if job.get("submission_id") and job["status"] in ("PENDING", "RUNNING")]
    for job_id in active:
        stop = urllib.request.Request(f"{running.dashboard_url}/api/jobs/{job_id}/stop", method="POST",
                                      headers=auth_headers(token))
        urllib.request.urlopen(stop, timeout=30).close()
    for job_id in active:
        _wait_status(job_id, token, {"STOPPED", "SUCCEEDED", "FAILED"}, url=running.dashboard_url)


def _job_status(url: str, token: str, job_id: str) -> str:
    request = urllib.request.Request(f"{url}/api/jobs/{job_id}", headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["status"]


def _wait_status(job_id: str, token: str, wanted: set[str], timeout: float = COMMAND_TIMEOUT, url: str | None = None) -> str:
    url = url or local.load().dashboard_url
    deadline = time.monotonic() + timeout
    while True:
        status = _job_status(url, token, job_id)
        if status in wanted:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for job {job_id} to reach {sorted(wanted)}; it is {status}")
        time.sleep(0.3)


def test_client_without_token_is_refused(cluster, jobs_stopped_after):
    url = local.load().dashboard_url
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/api/jobs/", timeout=10)
    assert missing.value.code == 401
    wrong = urllib.request.Request(f"{url}/api/jobs/", headers=auth_headers("not-the-token"))
    with pytest.raises(urllib.error.HTTPError) as invalid:
        urllib.request.urlopen(wrong, timeout=10)
    assert invalid.value.code == 403
    # ray_run pointed at the head with no token anywhere (fresh HOME): refused, nothing submitted.
    empty_home = cluster.work.parent / "empty-home"
    empty_home.mkdir(exist_ok=True)
    result = cluster.run(
        sys.executable, "-m", "marin.run.ray_run", "--no_wait", "--", "python", "long_job.py",
        env={"RAY_ADDRESS": url, "HOME": str(empty_home)},
    )  # fmt: skip

    assert result.returncode == 2
    assert "Missing authentication token" in result.stderr
    cluster.assert_token_never_shown()


def test_access_commands_point_at_the_token_file(cluster, capfd):
    running = local.load()
    code, out = cluster.cli(capfd, "--cluster", "local", "auth-env")
    assert code == 0
    assert out.splitlines() == [
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={local.token_path(cluster.state)}",
        f"export RAY_ADDRESS={running.dashboard_url}",
    ]
    code, out = cluster.cli(capfd, "--cluster", "local", "dashboard")
    assert code == 0 and running.dashboard_url in out
    code, out = cluster.cli(capfd, "--cluster", "local", "auth")
    assert code == 0 and str(local.token_path(cluster.state)) in out
    assert oct(local.token_path(cluster.state).stat().st_mode & 0o777) == "0o600"
    cluster.assert_token_never_shown()


def test_job_runs_lists_and_logs(cluster, capfd, jobs_stopped_after):
    result = cluster.run(
        sys.executable, "-m", "marin.run.ray_run", "--cluster", "local", "--tpu", "v4-8",
        "--submission-id", "ray-e2e", "--", "python", "ray_job.py",
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "RAY_RESULT 90" in result.stdout  # logs streamed while waiting
    assert "Job ray-e2e SUCCEEDED" in result.stderr

    code, out = cluster.cli(capfd, "--cluster", "local", "list-jobs")
    assert code == 0
    (line,) = [row for row in out.splitlines() if row.startswith("ray-e2e")]
    assert "SUCCEEDED" in line and "python ray_job.py" in line

    code, out = cluster.cli(capfd, "--cluster", "local", "job-logs", "ray-e2e")
    assert code == 0 and "RAY_RESULT 90" in out
    code, out = cluster.cli(capfd, "--cluster", "local", "wait-job", "ray-e2e")
    assert code == 0 and "SUCCEEDED" in out
    cluster.assert_token_never_shown()


def test_zephyr_script_runs_on_the_cluster(cluster, jobs_stopped_after):
    """The issue's acceptance path: a Zephyr pipeline submitted with ray_run, on the Ray backend."""
    result = cluster.run(
        sys.executable, "-m", "marin.run.ray_run", "--cluster", "local", "--submission-id", "zephyr-e2e",
        "-e", "MARK", "zephyr", "--", "python", "zephyr_job.py",
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "ZEPHYR_RESULT 34 3366" in result.stdout
    cluster.assert_token_never_shown()


def test_zephyr_command_submits_to_the_cluster(cluster, jobs_stopped_after):
    """`zephyr --cluster local script.py` goes through ray_run; the job's Zephyr joins the cluster."""
    (cluster.work / "cli_job.py").write_text(textwrap.dedent(
        """
        from zephyr import Dataset, flow_backend

        def main():
            print("CLI_RESULT", flow_backend().name, sum(flow_backend().execute(Dataset.from_list(list(range(10))).map(lambda x: x * x))))
        """
    ))
    result = cluster.run(
        sys.executable, "-m", "zephyr", "--cluster", "local", "--backend=ray", "--max-parallelism=2", "--quiet", "cli_job.py",
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "CLI_RESULT ray 285" in result.stdout
    cluster.assert_token_never_shown()


def test_failing_job_exits_non_zero(cluster, jobs_stopped_after):
    (cluster.work / "boom.py").write_text("raise SystemExit('boom')\n")
    result = cluster.run(sys.executable, "-m", "marin.run.ray_run", "--cluster", "local", "--", "python", "boom.py")
    assert result.returncode == 1
    assert "FAILED" in result.stderr


def test_stop_job(cluster, capfd, jobs_stopped_after):
    result = cluster.run(
        str(BIN / "marin"), "cluster", "--cluster", "local", "submit-job", "--no_wait", "--submission-id", "long-stop",
        "--", "python", "long_job.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "long-stop"
    _wait_status("long-stop", cluster.token, {"RUNNING"})
    code, out = cluster.cli(capfd, "--cluster", "local", "stop-job", "long-stop")
    assert code == 0 and "STOPPED" in out
    code, out = cluster.cli(capfd, "--cluster", "local", "wait-job", "long-stop")
    assert code == 1 and "STOPPED" in out
    cluster.assert_token_never_shown()


def test_dry_run_job_commands_neither_stop_nor_submit(cluster, capfd, jobs_stopped_after):
    """Regression: `marin cluster --dry-run stop-job ID` stopped the running job and
    `--dry-run submit-job` submitted its command. Read back from the job API: neither happens."""
    result = cluster.run(
        str(BIN / "marin"), "cluster", "--cluster", "local", "submit-job", "--no_wait", "--submission-id", "long-dry",
        "--", "python", "long_job.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _wait_status("long-dry", cluster.token, {"RUNNING"})
    code, out = cluster.cli(capfd, "--cluster", "local", "--dry-run", "stop-job", "long-dry")
    assert code == 0 and "would stop job long-dry" in out
    code, out = cluster.cli(capfd, "--cluster", "local", "--dry-run", "submit-job", "--submission-id", "never-submitted",
                            "--", "python", "long_job.py")  # fmt: skip
    assert code == 0 and "entrypoint:  python long_job.py" in out
    url = local.load().dashboard_url
    assert _job_status(url, cluster.token, "long-dry") == "RUNNING"
    with pytest.raises(urllib.error.HTTPError) as missing:
        _job_status(url, cluster.token, "never-submitted")
    assert missing.value.code == 404
    cluster.assert_token_never_shown()


def test_auto_stop_stops_the_job_when_the_launcher_is_interrupted(cluster, jobs_stopped_after):
    argv = [sys.executable, "-m", "marin.run.ray_run", "--cluster", "local", "--auto-stop",
            "--submission-id", "long-auto", "--", "python", "long_job.py"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | cluster.vars
    # SIGINT at its default in the launcher: a test run started in the background of a script
    # inherits SIGINT ignored (POSIX), and Python then never raises KeyboardInterrupt
    launcher = subprocess.Popen(argv, cwd=cluster.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the job is running once its first log line has been streamed
        lines, reader = _read_until(launcher, "LONG_JOB_STARTED")
        output = _signal_and_collect(launcher, signal.SIGINT, lines, reader)
    finally:
        launcher.kill()
        launcher.wait()
    cluster.outputs.append(output)
    assert launcher.returncode != 0 and "stopping job long-auto" in output
    assert _wait_status("long-auto", cluster.token, {"STOPPED"}) == "STOPPED"


@pytest.mark.parametrize("request_sent", [True, False], ids=["after-the-request", "before-the-request"])
def test_auto_stop_covers_an_interrupt_while_the_job_is_submitted(cluster, jobs_stopped_after, monkeypatch, capfd,
                                                                   request_sent):
    """Regression: Ctrl-C (or SIGTERM) while `submit` was uploading or waiting for the job
    server's answer left a job that the server had already created running, with no id printed.
    The launcher now picks the id itself and stops that job, or says it was never submitted."""
    real_submit, seen = ray_run.submit, []

    def interrupted_submit(client, request, runtime_env):
        seen.append(request.submission_id)
        if request_sent:
            real_submit(client, request, runtime_env)
        raise KeyboardInterrupt  # as Ctrl-C lands before `submit` returns

    monkeypatch.setattr(ray_run, "submit", interrupted_submit)
    monkeypatch.setattr(ray_run, "_LATE_SUBMIT_WAIT", 1.0)
    monkeypatch.chdir(cluster.work)
    code = ray_run.main(["--cluster", "local", "--auto-stop", "--", "python", "long_job.py"])
    captured = capfd.readouterr()
    cluster.outputs.append(captured.out + captured.err)
    (job_id,) = seen  # the fault landed, in the one submission
    assert code == 130 and job_id.startswith("raysubmit_") and f"stopping job {job_id}" in captured.err
    url = local.load().dashboard_url
    if request_sent:
        assert _wait_status(job_id, cluster.token, {"STOPPED"}, timeout=120) == "STOPPED"
    else:
        assert f"Job {job_id} was not submitted" in captured.err
        with pytest.raises(urllib.error.HTTPError) as missing:
            _job_status(url, cluster.token, job_id)
        assert missing.value.code == 404
    cluster.assert_token_never_shown()


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


# A zephyr script whose one shard runs for 10 minutes, once it has said so.
ZLONG = textwrap.dedent(
    """
    import time
    from zephyr import Dataset, flow_backend

    def slow(x):
        time.sleep(600)
        return x

    def main():
        print("ZLONG_STARTED", flush=True)
        list(flow_backend().execute(Dataset.from_list([1]).map(slow)))
    """
)


def _sigterm_zlong(cluster, fault=None, **env_vars: str) -> tuple[subprocess.Popen, str, float, list[int]]:
    """Run ZLONG with `zephyr --cluster local`; once its job runs, inject `fault(launcher_pid)`
    (which returns what undoes it), SIGTERM the command and wait for it to exit. Returns the
    command, its output, the seconds from the signal to its exit, and the launcher's pid(s)."""
    (cluster.work / "zlong.py").write_text(ZLONG)
    argv = [sys.executable, "-m", "zephyr", "--cluster", "local", "--backend=ray", "--quiet", "zlong.py"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"} | cluster.vars | env_vars
    command = subprocess.Popen(argv, cwd=cluster.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launchers: list[int] = []
    undo = None
    try:
        lines, reader = _read_until(command, "ZLONG_STARTED")
        launchers = _children(command.pid)
        assert len(launchers) == 1 and procfs.cmdline_contains(launchers[0], "marin.run.ray_run")
        undo = fault(launchers[0]) if fault is not None else None
        sent = time.monotonic()
        output = _signal_and_collect(command, signal.SIGTERM, lines, reader)
        took = time.monotonic() - sent
    finally:
        if undo is not None:
            undo()
        command.kill()
        command.wait()
        for pid in launchers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    cluster.outputs.append(output)
    return command, output, took, launchers


def _sigstop(pid: int, what: str):
    """SIGSTOP `pid` and wait until it is stopped (the fault landed); returns what resumes it."""
    os.kill(pid, signal.SIGSTOP)
    assert _wait_state(pid, "T"), f"{what} was not stopped"

    def resume():
        with contextlib.suppress(ProcessLookupError):  # gone: it was killed meanwhile
            os.kill(pid, signal.SIGCONT)

    return resume


def test_sigterm_to_the_zephyr_command_stops_its_cluster_job_and_launcher(cluster, jobs_stopped_after):
    """Regression: SIGTERM to `zephyr --cluster local script.py` killed only the zephyr process;
    its job launcher lived on (re-parented to init, streaming logs) and the job kept running. Now
    the launcher is handed the signal and waited for, the job is STOPPED and the command exits 143."""
    command, output, _, launchers = _sigterm_zlong(cluster)
    assert command.returncode == 143, output[-3000:]
    assert not [pid for pid in launchers if process_alive(pid)], "the job launcher outlived the zephyr command"
    running = local.load()
    (job,) = [j for j in _jobs(running.dashboard_url, cluster.token) if "zlong.py" in j["entrypoint"]]
    assert _wait_status(job["submission_id"], cluster.token, {"STOPPED", "SUCCEEDED", "FAILED"}) == "STOPPED"
    cluster.assert_token_never_shown()


def test_a_job_server_that_never_answers_the_stop_request_does_not_hold_the_command(cluster, jobs_stopped_after):
    """Ray's job client sets no timeout: with the head's dashboard (the job server) SIGSTOPped, the
    launcher's stop request would wait forever. It gives up after `MARIN_STOP_REQUEST_TIMEOUT` (30 s;
    5 here: the give-up is the same), says the job may still run, and ends; the `zephyr --cluster`
    command exits 143 before its own deadline."""
    give_up = 5.0

    def stop_the_job_server(launcher: int):
        processes = local._snapshot(local.load(cluster.state))
        (server,) = [pid for pid in processes if procfs.cmdline_contains(pid, "dashboard/dashboard.py")]
        return _sigstop(server, "the job server")

    command, output, took, _ = _sigterm_zlong(cluster, stop_the_job_server, MARIN_STOP_REQUEST_TIMEOUT=str(give_up))
    assert command.returncode == 143, output[-3000:]
    assert f"did not answer the stop request within {give_up:.0f}s" in output, output[-3000:]
    assert "had not ended" not in output, output[-3000:]  # the launcher ended by itself, not killed
    assert give_up <= took < zephyr_cli.LAUNCHER_STOP_DEADLINE, (took, output[-3000:])
    cluster.assert_token_never_shown()


def test_a_launcher_that_does_not_end_after_the_signal_is_killed_and_the_job_named(cluster, jobs_stopped_after):
    """A stopping `zephyr --cluster` command must end: if its job launcher has not ended within
    the deadline after the signal was passed on (here it is SIGSTOPped, as a launcher stuck on a
    job server that never answers is), the command kills it, names the job that may still run,
    and exits 143."""
    stop_the_launcher = lambda launcher: _sigstop(launcher, "the launcher")  # noqa: E731
    command, output, took, launchers = _sigterm_zlong(cluster, stop_the_launcher, ZEPHYR_LAUNCHER_STOP_DEADLINE="5")
    assert command.returncode == 143, output[-3000:]
    assert 5 <= took < 60, (took, output[-3000:])
    assert not [pid for pid in launchers if process_alive(pid)], "the stuck launcher outlived the zephyr command"
    (job_id,) = re.findall(r"job (raysubmit_\w+) may still be running", output)
    assert f"stop-job {job_id}" in output
    assert _job_status(local.load().dashboard_url, cluster.token, job_id) in ("PENDING", "RUNNING")  # it was named right
    cluster.assert_token_never_shown()


def _wait_state(pid: int, state: str, timeout: float = 30) -> bool:
    """Wait until process `pid` is in `state` (the letter /proc/PID/stat shows: T for stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == state:
                return True
        time.sleep(0.1)
    return False


def _jobs(url: str, token: str) -> list[dict]:
    request = urllib.request.Request(f"{url}/api/jobs/", headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=30) as response:
        return [job for job in json.load(response) if job.get("submission_id")]


def test_add_worker_joins_a_simulated_tpu_host(cluster, capfd):
    code, out = cluster.cli(capfd, "--cluster", "local", "add-worker", "v5e-4")
    assert code == 0, out
    url, token = local.load().dashboard_url, cluster.token
    request = urllib.request.Request(f"{url}/api/v0/nodes", headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=10) as response:
        nodes = json.load(response)["data"]["result"]["result"]
    heads = [n["resources_total"] for n in nodes if n["state"] == "ALIVE"]
    assert any(r.get("TPU-v5litepod-4-head") == 1 for r in heads)


def test_restart_preserves_running_jobs_then_stop_cluster(tmp_path, capfd):
    """On a cluster of its own: its only job is the one it submits, whatever other tests left."""
    with _running_cluster(tmp_path) as own:
        result = own.run(
            sys.executable, "-m", "marin.run.ray_run", "--cluster", "local", "--no_wait", "--submission-id", "long-keep",
            "-e", "MARK=kept", "--", "python", "long_job.py",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        _wait_status("long-keep", own.token, {"RUNNING"})
        before = local.load()

        code, out = own.cli(capfd, "--cluster", "local", "restart-cluster", "--preserve-jobs")
        assert code == 0, out
        assert "Recorded 1 running job(s)" in out and "Resubmitted long-keep" in out
        after = local.load()
        assert after.head.pid != before.head.pid  # a new head ...
        assert _wait_status("long-keep", own.token, {"RUNNING"}) == "RUNNING"  # ... running the same job
        _wait_until(lambda: "LONG_JOB_STARTED kept" in own.cli(capfd, "--cluster", "local", "job-logs", "long-keep")[1],
                    "the resubmitted job to log its first line")
        code, out = own.cli(capfd, "--cluster", "local", "list-jobs")
        assert [row.split()[:2] for row in out.splitlines()[1:]] == [["long-keep", "RUNNING"]]  # old head's history is gone

        # The token appears in none of our outputs nor in the head's own logs.
        for path in [own.state / "head.log", *Path(after.temp_dir).rglob("*.log"), *Path(after.temp_dir).rglob("*.out")]:
            if path.is_file():
                own.outputs.append(path.read_text(errors="replace"))
        own.assert_token_never_shown()

        members = local._members(after)
        spawned = {pid: procfs.start_time(pid) for pid in [*members, *procfs.descendants(members)]}
        code, out = own.cli(capfd, "--cluster", "local", "stop-cluster")
        assert code == 0 and "stopped" in out
        assert local.load() is None
        assert not Path(after.temp_dir).exists()
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", after.head.ports["dashboard"])) != 0
        assert local._members(after) == []
        # and no process the cluster started (Ray's renamed agents carry no marker /proc shows)
        assert [pid for pid, started in spawned.items() if procfs.start_time(pid) == started] == []


def _read_until(proc: subprocess.Popen, marker: str) -> tuple[list[str], threading.Thread]:
    """Collect `proc`'s output lines (in a thread: a process that prints nothing must not block
    the test past its deadline) until one holds `marker`; the lines so far, and the reader."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    _wait_until(lambda: any(marker in line for line in lines) or not reader.is_alive(), f"a line with {marker}")
    assert any(marker in line for line in lines), "".join(lines)[-3000:]
    return lines, reader


def _signal_and_collect(proc: subprocess.Popen, signum: int, lines: list[str], reader: threading.Thread) -> str:
    """Send `signum`, wait for `proc` to exit; its whole output."""
    proc.send_signal(signum)
    proc.wait(timeout=COMMAND_TIMEOUT)
    reader.join(timeout=30)
    return "".join(lines)


def _wait_until(condition, what: str, timeout: float = COMMAND_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.5)


def test_a_head_whose_port_was_taken_meanwhile_is_restarted_on_new_ports(tmp_path, monkeypatch, capfd):
    """Another process binds the dashboard port between choosing and `ray start`: the head exits
    and start() tries again on a fresh block of ports instead of failing."""
    blocker = socket.socket()
    blocker.bind(("", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    choices = []

    def ports_with_one_taken():
        ports = real_free_ports()
        if not choices:  # the first attempt's dashboard port is the one someone else holds
            ports["dashboard"] = taken
        choices.append(ports)
        return ports

    real_free_ports = local._free_ports
    monkeypatch.setattr(local, "_free_ports", ports_with_one_taken)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    state = tmp_path / "state"
    try:
        cluster = local.start(state)
        assert len(choices) == 2 and cluster.head.ports == choices[1]
        assert "retrying on new ports" in capfd.readouterr().err
        assert local.load(state) is not None
    finally:
        blocker.close()
        local.stop(state)
    assert local.load(state) is None



def test_stop_ends_a_cluster_process_still_listening_on_its_ports(tmp_path):
    """Regression (issue 24, item 9): stop-cluster once left Ray's dashboard and runtime-env
    agents running, holding the cluster's ports. A process of the cluster that the marker scan
    misses but that listens on one of its ports (here a stand-in started from its session
    directory, untagged) is found by its port and ended; the port is free afterwards."""
    session = tmp_path / "session"
    session.mkdir()
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(600)")
    env = {k: v for k, v in os.environ.items() if k != local.MARKER_ENV}
    agent = subprocess.Popen([sys.executable, "-c", code, str(session)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(agent.stdout.readline())
        gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a head pid that no longer runs
        gone.wait()
        # a marker no process has: only the port finds the stand-in agent
        cluster = local.LocalCluster(directory=str(tmp_path / "state"), temp_dir=str(session), num_cpus=1,
                                     head=local.LocalNode(pid=gone.pid, ports={"agent_http": port}, resources={}),
                                     marker="stand-in-marker-nobody-has")
        assert procfs.listeners({port}) == {port: [agent.pid]}  # the fault is in place
        assert local._cleanup(cluster, grace=0.1) == {}
        assert agent.wait(timeout=60) == -signal.SIGKILL
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_stop_ends_the_children_of_the_clusters_processes_that_carry_no_marker(tmp_path):
    """Regression: Ray's dashboard and runtime-env agents rename themselves, which blanks the
    environment /proc shows, so the marker scan missed them and they outlived stop-cluster
    (found by a review helper). A tagged stand-in member starts a child with no marker, no
    session-directory argument and no port; stop finds the child through its parent."""
    marker = f"stand-in-{os.getpid()}-{time.monotonic_ns()}"
    child_code = "import time; time.sleep(600)"
    member_code = ("import os, subprocess, sys, time\n"
                   f"env = {{k: v for k, v in os.environ.items() if k != {local.MARKER_ENV!r}}}\n"
                   f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}], env=env)\n"
                   "print(child.pid, flush=True)\n"
                   "time.sleep(600)\n")
    member = subprocess.Popen([sys.executable, "-c", member_code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, local.MARKER_ENV: marker}, start_new_session=True)
    child_pid = None
    try:
        child_pid = int(member.stdout.readline())
        assert not procfs.has_env_entry(child_pid, f"{local.MARKER_ENV}={marker}".encode())  # the fault is in place
        gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a head pid that no longer runs
        gone.wait()
        cluster = local.LocalCluster(directory=str(tmp_path / "state"), temp_dir=str(tmp_path / "session"), num_cpus=1,
                                     head=local.LocalNode(pid=gone.pid, ports={}, resources={}), marker=marker)
        assert local._cleanup(cluster, grace=5.0) == {}
        assert member.wait(timeout=60) in (-signal.SIGTERM, -signal.SIGKILL)
        _wait_until(lambda: not process_alive(child_pid), "the marker-less child to end", timeout=60)
    finally:
        for pid in (member.pid, child_pid):
            if pid and process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if member.poll() is None:
            member.wait()
