"""Command lines of `marin cluster ... --dry-run` (fast: nothing is run, no Ray, no cloud)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.cluster import cli

SENTINEL_TOKEN = "tok-SENTINEL-0123456789abcdef"


@pytest.fixture(autouse=True)
def isolated_tokens(tmp_path, monkeypatch):
    """A cached cloud token and a local state dir that belong to this test only."""
    monkeypatch.setenv("MARIN_TOKEN_DIR", str(tmp_path / "tokens"))
    monkeypatch.setenv("MARIN_LOCAL_CLUSTER_DIR", str(tmp_path / "local"))
    monkeypatch.delenv("MARIN_CLUSTER", raising=False)
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "auth_token").write_text(SENTINEL_TOKEN)


def dry_run(capsys, *args: str) -> list[list[str]]:
    """Run `marin cluster --dry-run ARGS`; the printed commands, comments dropped."""
    assert cli.main(["--dry-run", *args]) == 0
    captured = capsys.readouterr()
    assert SENTINEL_TOKEN not in captured.out + captured.err
    lines = [line for line in captured.out.splitlines() if line and not line.startswith("#")]
    return [shlex.split(line) for line in lines]


def test_start_and_stop_cluster(capsys):
    config = "infra/marin-us-central2.yaml"
    assert dry_run(capsys, "--config", config, "start-cluster") == [["ray", "up", "-y", "--no-config-cache", config]]
    assert dry_run(capsys, "--cluster", "us-central2", "stop-cluster") == [["ray", "down", "-y", config]]


def test_dry_run_flag_after_the_subcommand(capsys):
    assert cli.main(["--cluster", "us-west4", "stop-cluster", "--dry-run"]) == 0
    assert capsys.readouterr().out.split() == ["ray", "down", "-y", "infra/marin-us-west4.yaml"]


@pytest.mark.parametrize(
    ("flag", "preserve"),
    [("--preserve-jobs", True), ("--no-preserve-jobs", False),
     # the spelling of the infra guide (`--preserve-jobs=0`, default `--preserve-jobs=1`)
     ("--preserve-jobs=0", False), ("--preserve-jobs=1", True), ("--preserve-jobs=false", False)],
)  # fmt: skip
def test_restart_cluster(capsys, flag, preserve):
    assert cli.main(["--dry-run", "--cluster", "eu-west4", "restart-cluster", flag]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if not line.startswith("#")]
    assert commands == ["ray down -y infra/marin-eu-west4.yaml", "ray up -y --no-config-cache infra/marin-eu-west4.yaml"]
    assert ("resubmit the recorded jobs" in out) is preserve


def test_restart_cluster_refuses_a_preserve_jobs_value_that_is_no_boolean(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--dry-run", "--cluster", "eu-west4", "restart-cluster", "--preserve-jobs=maybe"])
    assert "--preserve-jobs: expected 1/0, true/false or yes/no, got 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        ("preemptible", ["gcloud", "compute", "tpus", "tpu-vm", "create", "w1", "--accelerator-type=v6e-8",
                         "--version=v2-alpha-tpuv6e", "--preemptible", "--zone=us-east5-b", "--project=hai-gcp-models"]),
        ("reserved", ["gcloud", "compute", "tpus", "tpu-vm", "create", "w1", "--accelerator-type=v6e-8",
                      "--version=v2-alpha-tpuv6e", "--reserved", "--zone=us-east5-b", "--project=hai-gcp-models"]),
        ("best-effort", ["gcloud", "alpha", "compute", "tpus", "queued-resources", "create", "w1", "--node-id=w1",
                         "--accelerator-type=v6e-8", "--runtime-version=v2-alpha-tpuv6e", "--best-effort",
                         "--zone=us-east5-b", "--project=hai-gcp-models"]),
    ],
)  # fmt: skip
def test_add_worker(capsys, capacity, expected):
    create, join = dry_run(capsys, "--cluster", "us-east5", "add-worker", "v6e-8", "--capacity", capacity, "--name", "w1")
    assert create == expected
    assert join[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "w1", "--zone=us-east5-b",
                        "--project=hai-gcp-models", "--worker=all"]  # fmt: skip
    script = join[9].removeprefix("--command=")
    # The worker reads the token from Secret Manager itself and joins with token auth.
    assert "gcloud secrets versions access latest --secret=RAY_AUTH_TOKEN" in script
    assert "-e RAY_AUTH_MODE=token" in script and "--address=<head-ip>:6379" in script


def test_add_worker_rejects_unknown_capacity(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--dry-run", "--cluster", "us-east5", "add-worker", "v6e-8", "--capacity", "spot"])
    assert "invalid choice" in capsys.readouterr().err


def test_dashboard(capsys):
    (ssh,) = dry_run(capsys, "--cluster", "big-run", "dashboard", "--port", "9999")
    assert ssh[0] == "ssh" and ssh[-1] == "ray@<head-ip>"
    assert ["-L", "9999:localhost:8265"] == ssh[ssh.index("-L") : ssh.index("-L") + 2]
    assert ["-i", "~/.ssh/marin_ray_cluster.pem"] == ssh[ssh.index("-i") : ssh.index("-i") + 2]


def test_auth_fetches_into_a_file_and_never_prints_the_token(capsys, tmp_path):
    assert cli.main(["--dry-run", "--cluster", "us-central2", "auth"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == (
        "gcloud secrets versions access latest --secret=RAY_AUTH_TOKEN --project=hai-gcp-models"
        f" > {tmp_path / 'tokens' / 'auth_token'}"
    )


def test_auth_env(capsys, tmp_path):
    assert cli.main(["--cluster", "us-central2", "auth-env"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN_PATH={tmp_path / 'tokens' / 'auth_token'}"]
    assert SENTINEL_TOKEN not in out


def test_local_start_uses_explicit_ports_and_simulated_tpu(capsys):
    generate, start = dry_run(capsys, "--cluster", "local", "start-cluster")
    assert generate[-2:] == ["get-auth-token", "--generate"]
    assert start[2:6] == ["ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]
    assert "--head" in start and '--resources={"TPU":4,"TPU-v4-8-head":1}' in start
    for option in ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port"):
        (value,) = [arg.split("=", 1)[1] for arg in start if arg.startswith(option + "=")]
        assert int(value) not in (6379, 8265, 10001, 52365)


def test_list_configs(capsys):
    assert cli.main(["list-configs"]) == 0
    out = capsys.readouterr().out
    assert "local" in out and "infra/marin-big-run.yaml" in out and "gs://marin-eu-west4" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "us-nowhere", "list-jobs"], "Unknown cluster 'us-nowhere'"),
        (["--cluster", "local", "--config", "infra/marin-us-west4.yaml", "list-jobs"], "either --cluster or --config"),
        (["list-jobs"], "No cluster given"),
        (["--cluster", "local", "list-jobs"], "local cluster is not running"),
    ],
)
def test_errors_name_the_fix(capsys, args, message):
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_errors_are_scrubbed_of_known_tokens(capsys, monkeypatch, tmp_path):
    """A failing tool whose stderr carries the token: the error we print does not."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_ray = fake_bin / "ray"  # a stand-in for `ray get-head-ip` that fails loudly
    fake_ray.write_text(f"#!/bin/sh\necho 'cannot reach head; header Bearer {SENTINEL_TOKEN}' >&2\nexit 3\n")
    fake_ray.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    assert cli.main(["--cluster", "us-central2", "dashboard"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach head" in err and "<redacted-token>" in err and SENTINEL_TOKEN not in err


def _logging_tool_stand_ins(tmp_path, monkeypatch) -> Path:
    """`ray`, `ssh` and `gcloud` on PATH that log their calls to the returned file and fail."""
    fake_bin, calls = tmp_path / "bin", tmp_path / "calls.log"
    fake_bin.mkdir()
    for tool in ("ray", "ssh", "gcloud"):
        (fake_bin / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 3\n')
        (fake_bin / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("MARIN_DASHBOARD_DIR", str(tmp_path / "dashboards"))
    return calls


@pytest.mark.parametrize(
    "command",
    [["submit-job", "--no_wait", "--", "python", "job.py"], ["stop-job", "raysubmit_1"], ["list-jobs"],
     ["job-logs", "raysubmit_1"], ["wait-job", "raysubmit_1"]],
)  # fmt: skip
def test_job_commands_under_dry_run_contact_no_cluster(capsys, monkeypatch, tmp_path, command):
    """Regression: the job commands ignored --dry-run, so `marin cluster --dry-run stop-job ID`
    stopped the job and `--dry-run submit-job` submitted one. Now they run no tool (`ray
    get-head-ip`, `ssh`, `gcloud`: stand-ins that log their calls here) and call no job API."""
    calls = _logging_tool_stand_ins(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    code = cli.main(["--dry-run", "--cluster", "us-central2", *command])
    out = capsys.readouterr()
    assert not calls.exists(), calls.read_text()
    assert code == 0, out.err
    assert SENTINEL_TOKEN not in out.out + out.err


def test_submit_job_on_a_config_copy_reaches_the_cluster_through_the_copy(capsys, monkeypatch, tmp_path):
    """Regression: `marin cluster --config COPY.yaml submit-job` handed ray_run only the
    cluster's name, so the job went through infra/'s config of that name, not the copy. The
    tools are stand-ins that log their calls and fail, so nothing is submitted."""
    root = Path(__file__).resolve().parents[3]
    copy = tmp_path / "mine.yaml"
    copy.write_text((root / "infra" / "marin-us-central2.yaml").read_text() + "\n# hand-edited\n")
    calls = _logging_tool_stand_ins(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["--config", str(copy), "submit-job", "--no_wait", "--", "python", "job.py"]) != 0
    capsys.readouterr()
    logged = calls.read_text()
    assert str(copy) in logged and "infra/marin-us-central2.yaml" not in logged, logged


def test_marin_command_and_script_wrapper_are_one_entry_point():
    root = Path(__file__).resolve().parents[3]
    args = ["--cluster", "us-west4", "--dry-run", "stop-cluster"]
    commands = [
        [sys.executable, "scripts/ray/cluster.py", *args],
        [str(Path(sys.executable).parent / "marin"), "cluster", *args],
    ]
    for argv in commands:
        result = subprocess.run(argv, cwd=root, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "ray down -y infra/marin-us-west4.yaml\n"


def test_job_commands_reuse_only_a_recorded_forward_to_the_same_cluster(monkeypatch, tmp_path):
    """Bug 4: any listener on 127.0.0.1:8265 was taken to be the target cloud cluster, so a
    forward to us-west4 (or any local dashboard) got us-east5's jobs and token. Now only a
    `dashboard` record {cluster, port, pid} naming the cluster, with a live pid, is reused."""
    import socket

    from marin.cluster import target as target_mod

    monkeypatch.setenv("MARIN_DASHBOARD_DIR", str(tmp_path / "dashboards"))
    east = target_mod.resolve_target("us-east5")
    with socket.socket() as listener:  # a dummy dashboard on the default port's stand-in
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.setattr(target_mod, "DASHBOARD_PORT", port)

        class TunnelWanted(Exception):
            pass

        def no_tunnel(*args, **kwargs):
            raise TunnelWanted

        monkeypatch.setattr(target_mod, "run_command", no_tunnel)

        def address():
            with target_mod.dashboard_address(east) as url:
                return url

        # an unrecorded listener: not trusted, a tunnel of our own is opened instead
        with pytest.raises(TunnelWanted):
            address()
        # a forward to another cluster: not reused
        target_mod.record_forward("us-west4", port, os.getpid())
        with pytest.raises(TunnelWanted):
            address()
        # a record naming us-east5 whose forwarding process is gone: not reused
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        target_mod.record_forward("us-east5", port, dead.pid)
        with pytest.raises(TunnelWanted):
            address()
        # the live forward to us-east5: reused
        target_mod.record_forward("us-east5", port, os.getpid())
        assert address() == f"http://127.0.0.1:{port}"
        target_mod.clear_forward(port, os.getpid())
        with pytest.raises(TunnelWanted):
            address()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads Linux /proc")
def test_local_cleanup_matches_only_the_marker_not_a_reused_session_id(tmp_path):
    """Bug 8 (local.py): cleanup matched every process whose session id equals a recorded
    node pid; once the head is dead that pid can lead an unrelated session (PID reuse), whose
    processes were then SIGKILLed. Only the cluster's marker env var counts now."""
    from marin.cluster import local

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    env = {**os.environ, local.MARKER_ENV: "test-marker-123"}
    tagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        # the recorded head pid is now the stranger's pid, which leads the stranger's session
        cluster = local.LocalCluster(str(tmp_path), str(tmp_path / "tmp"), 1,
                                     local.LocalNode(stranger.pid, {}, {}), marker="test-marker-123")
        deadline = time.monotonic() + 120
        while tagged.pid not in (members := local._members(cluster)) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child's environ is readable
        assert tagged.pid in members
        assert stranger.pid not in members
    finally:
        for proc in (stranger, tagged):
            proc.kill()
            proc.wait()


def test_local_ports_are_drawn_below_the_ephemeral_range_and_never_rays_defaults():
    from marin.cluster import local

    for _ in range(20):
        ports = local._free_ports()
        values = sorted(ports[name] for name in ports if name != "max_worker") + [ports["max_worker"]]
        assert values == list(range(values[0], values[0] + len(values) - 1)) + [ports["max_worker"]]
        assert ports["max_worker"] - ports["min_worker"] == local._WORKER_PORTS - 1
        low, high = local._quiet_range()
        assert low <= values[0] and ports["max_worker"] < high
        assert not {6379, 8265, 10001, 52365} & set(range(values[0], ports["max_worker"] + 1))
