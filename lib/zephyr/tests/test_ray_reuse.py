"""Small runs on a reused local Ray (issue 41): `zephyr --backend=ray` without an address leaves a
Ray running for later runs, which connect to it instead of paying Ray's start-up again.

Hermetic: every head lives under this module's own `ZEPHYR_RAY_DIR`, and Ray's address file is
looked up under its own `RAY_TMPDIR`, so no other test's `ray start` (which writes
/tmp/ray/ray_current_cluster) is ever picked up; every head is stopped in a finalizer, pass or
fail. The module shares its heads across tests, in order: one head serves the reuse, warm-worker,
`ray start` detection and idle-stop tests (the test itself holds a lease, as a run does, until the
idle test lets go), a second is killed behind zephyr's back, and the third, started in its place,
is stopped with `zephyr ray stop`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zephyr
from zephyr.backends.ray_head import Lease, head_dir, read_state, start_head, stop_head

PROBE = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, flow_backend

    def probe(i):
        return {"i": i, "square": i * i, "cwd": os.getcwd(), "mark": os.environ.get("REUSE_MARK"), "pid": os.getpid()}

    def main():
        ds = Dataset.from_list(list(range(6))).map(probe).write_jsonl(sys.argv[1] + "/part-{shard}.jsonl")
        list(flow_backend().execute(ds))
    """
)
LINE = re.compile(r"^zephyr: (started a local Ray|reusing the local Ray|using the Ray) at (\S+?)[ ,]", re.M)
TINY_IDLE_MINUTES = "0.05"  # 3 s


def oracle(cwd: Path, mark: str) -> list[dict]:
    """What the probe pipeline writes, computed in plain Python."""
    return [{"i": i, "square": i * i, "cwd": str(cwd), "mark": mark} for i in range(6)]


def written(out: Path) -> tuple[list[dict], set[int]]:
    """The probe's rows (without the worker pid), and the pids of the workers that wrote them."""
    rows = [json.loads(line) for path in out.glob("part-*.jsonl") for line in path.read_text().splitlines()]
    pids = {row.pop("pid") for row in rows}
    return sorted(rows, key=lambda row: row["i"]), pids


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes of session `session`, read from /proc here, apart from zephyr's code."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[3] == str(session) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def warm_workers(session: int, cwd: Path, mark: str) -> set[int]:
    """Idle Ray workers of the head's session started for runs in `cwd` with REUSE_MARK=`mark`."""
    found = set()
    for pid in session_members(session):
        try:
            idle = Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::IDLE")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if idle and f"REUSE_MARK={mark}".encode() in environ and f"ZEPHYR_DRIVER_CWD={cwd}".encode() in environ:
            found.add(pid)
    return found


class Place:
    """This module's own directories and environment, and the `zephyr` runs made in them."""

    def __init__(self, root: Path):
        self.root = root
        self.base = root / "zephyr-ray"
        self.ray_tmp = root / "ray-tmp"  # Ray's address file is looked up here, never in /tmp/ray
        self.ray_tmp.mkdir()
        self.directory = head_dir(self.base)
        drop = ("ZEPHYR_LOCAL_RAY", "RAY_ADDRESS", "ZEPHYR_RAY_IDLE_MINUTES", "REUSE_MARK")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(ZEPHYR_RAY_DIR=str(self.base), RAY_TMPDIR=str(self.ray_tmp))
        self.script = root / "probe.py"
        self.script.write_text(PROBE)
        self.runs = 0

    def run(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zephyr", *args], cwd=self.root, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=600)

    def probe(self, mark: str, env: dict | None = None, cwd: Path | None = None) -> tuple[str, str, set[int]]:
        """Run the probe pipeline on `--backend=ray` in `cwd` (default a new directory) with
        REUSE_MARK=mark; check its outputs against the oracle; return which Ray its line names,
        where, and the pids of the workers that ran its tasks."""
        self.runs += 1
        out = self.root / f"out-{self.runs}"
        cwd = cwd or self.root / f"cwd-{self.runs}"
        cwd.mkdir(exist_ok=True)
        result = subprocess.run([sys.executable, "-m", "zephyr", "--backend=ray", "--max-parallelism=2", str(self.script),
                                 str(out)], cwd=cwd, env={**self.env, "REUSE_MARK": mark, **(env or {})},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = LINE.findall(result.stderr)
        assert len(lines) == 1, result.stderr[-3000:]
        rows, pids = written(out)
        assert rows == oracle(cwd, mark)  # the driver's environment and directory reached the workers
        return (*lines[0], pids)

    def address_file(self) -> Path:
        return self.ray_tmp / "ray" / "ray_current_cluster"

    def stop_all(self) -> None:
        for directory in self.base.glob("*"):
            stop_head(directory)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    place = Place(tmp_path_factory.mktemp("reuse"))
    try:
        yield place
    finally:
        place.stop_all()


@pytest.fixture(scope="module")
def held(place):
    """A lease of this test's own on the module's first head, as a connected run holds one: the
    head, started with a tiny idle time, stays up between runs until the idle test releases it."""
    lease = Lease(place.directory)
    try:
        yield lease
    finally:
        lease.release()


@pytest.mark.ray
@pytest.mark.slow
def test_the_second_run_reuses_the_ray_the_first_started(place, held):
    kind, address, _ = place.probe("first", env={"ZEPHYR_RAY_IDLE_MINUTES": TINY_IDLE_MINUTES})
    state = read_state(place.directory)
    assert kind == "started a local Ray" and state is not None and address == state.gcs_address
    # a stale address file (nothing listens there) is not a `ray start` Ray: zephyr's own head is reused
    place.address_file().parent.mkdir(exist_ok=True)
    place.address_file().write_text("127.0.0.1:9")
    kind, address, _ = place.probe("second", cwd=place.root / "cwd")
    assert (kind, address) == ("reusing the local Ray", state.gcs_address)
    assert read_state(place.directory) == state  # the same head, not a new one on the same port
    live = [p.name for p in (place.directory / "leases").iterdir()]
    assert live == [held.path.name]  # each run's lease went with it; this test's own stays


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_like_the_last_gets_the_workers_it_left_started(place, held, wait_until):
    state = read_state(place.directory)
    assert state is not None, "the first test's head is gone"
    cwd = place.root / "cwd"  # where the last run ran, with REUSE_MARK=second
    expected = min(2, os.cpu_count())  # the run kept 2 tasks in flight (--max-parallelism=2), at most one per CPU

    def started_ahead() -> set[int]:
        warm = warm_workers(state.supervisor_pid, cwd, "second")
        return warm if len(warm) >= expected else set()

    warm = wait_until(started_ahead, "workers started ahead for the next run")
    _, _, pids = place.probe("second", cwd=cwd)
    assert pids and pids <= warm  # every task ran in a worker started ahead, with this run's environment
    # zephyr's code changed since those workers imported it: the next run starts workers of its own
    warm = wait_until(started_ahead, "workers started ahead for the next run")
    os.utime(Path(zephyr.__file__))
    _, _, pids = place.probe("second", cwd=cwd)
    assert pids and not pids & warm


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_started_with_ray_start_is_used_as_it_is(place, held):
    state = read_state(place.directory)
    assert state is not None, "the first test's head is gone"
    # The head is a real `ray start --head`; it writes its address file in its own temp dir, where
    # no `ray.init()` looks: published in Ray's address file, it is what a user's `ray start` is.
    place.address_file().write_text(state.gcs_address)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": state.token_path}  # the user's settings for their Ray
    try:
        assert place.probe("ray-start", env=auth)[:2] == ("using the Ray", state.gcs_address)
    finally:
        place.address_file().unlink()
    assert read_state(place.directory) == state and state.alive  # zephyr leaves such a Ray running


@pytest.mark.ray
@pytest.mark.slow
def test_an_unused_head_stops_by_itself(place, held, wait_until):
    state = read_state(place.directory)
    assert state is not None and state.alive and session_members(state.supervisor_pid)
    assert state.idle_s == float(TINY_IDLE_MINUTES) * 60
    held.release()
    wait_until(lambda: not session_members(state.supervisor_pid), "the idle head's processes to end")
    assert read_state(place.directory) is None and not Path(state.temp_dir).exists()
    assert "stopping: unused for" in (place.directory / "supervisor.log").read_text()


@pytest.mark.ray
@pytest.mark.slow
def test_a_head_killed_behind_our_back_is_replaced_and_zephyr_ray_stop_ends_it(place, wait_until):
    killed = start_head(place.directory)  # as the first run would (see the first test)
    for pid in session_members(killed.supervisor_pid):  # as `kill -9` or the OOM killer would
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not session_members(killed.supervisor_pid), "the killed head's processes to end")
    assert read_state(place.directory) == killed  # its record is left behind, pointing at nothing
    kind, address, _ = place.probe("after-kill")
    fresh = read_state(place.directory)
    assert kind == "started a local Ray" and fresh is not None and address == fresh.gcs_address
    assert fresh.supervisor_pid != killed.supervisor_pid and not Path(killed.temp_dir).exists()

    status = place.run("ray", "status")
    assert status.returncode == 0 and f"local Ray at {fresh.gcs_address}: up" in status.stdout, status
    assert session_members(fresh.supervisor_pid)
    stop = place.run("ray", "stop")
    assert stop.returncode == 0 and f"stopped the local Ray at {fresh.gcs_address}" in stop.stdout, stop
    assert not session_members(fresh.supervisor_pid), "processes of the stopped head's session are left"
    assert read_state(place.directory) is None and not Path(fresh.temp_dir).exists()
    assert "no local Ray of zephyr's runs is running" in place.run("ray", "status").stdout


def test_the_command_reuses_a_local_ray_unless_told_otherwise_and_library_use_embeds_one(monkeypatch):
    from zephyr import create_backend
    from zephyr.cli import build_parser, make_backend

    def local_ray(*argv: str) -> str:
        backend = make_backend(build_parser().parse_args([*argv, "script.py"]))
        try:
            return backend.local_ray
        finally:
            backend.close()

    monkeypatch.delenv("ZEPHYR_LOCAL_RAY", raising=False)
    assert local_ray("--backend=ray") == "reuse"
    assert local_ray("--backend=ray", "--local-ray=embedded") == "embedded"
    monkeypatch.setenv("ZEPHYR_LOCAL_RAY", "embedded")
    assert local_ray("--backend=ray") == "embedded"
    assert local_ray("--backend=ray", "--local-ray=reuse") == "reuse"  # the flag wins
    monkeypatch.delenv("ZEPHYR_LOCAL_RAY")
    backend = create_backend("ray")
    assert backend.local_ray == "embedded"  # a RayBackend made in a program keeps an embedded Ray
    backend.close()


@pytest.mark.parametrize("argv, env, message", [
    (["--backend=ray"], {"ZEPHYR_LOCAL_RAY": "shared"}, "ZEPHYR_LOCAL_RAY must be one of reuse, embedded; got 'shared'"),
    (["--backend=threadpool", "--local-ray=reuse"], {}, "--local-ray only applies to --backend=ray"),
    (["--backend=ray", "--local-ray=shared"], {}, "argument --local-ray: invalid choice: 'shared'"),
])
def test_a_bad_local_ray_choice_is_refused_with_the_choices(tmp_path, monkeypatch, capsys, argv, env, message):
    from zephyr.cli import main

    script = tmp_path / "script.py"
    script.write_text("print('ran')\n")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exited:
        main([*argv, str(script)])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "ran" not in captured.out


def test_a_ray_backend_refuses_an_unknown_local_ray():
    from zephyr.backends.ray import RayBackend

    with pytest.raises(ValueError, match="local_ray must be one of embedded, reuse; got 'shared'"):
        RayBackend(local_ray="shared")


@pytest.mark.slow
def test_a_head_that_cannot_start_fails_the_run_in_one_line_naming_its_log(tmp_path):
    """The supervisor cannot write the head's token (a directory stands in its place): it exits
    before starting Ray, and the run says so, with the way out, instead of a traceback."""
    place = Place(tmp_path)
    (place.directory / "auth_token").mkdir(parents=True)
    try:
        result = place.run("--backend=ray", str(place.script), str(tmp_path / "out"))
    finally:
        place.stop_all()  # none should have started; if one did, it does not outlive the test
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("zephyr: error: LocalRayError: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr.split(errors[0])[0], result.stderr[-3000:]
    assert "its supervisor exited with 1" in errors[0] and f"{place.directory / 'supervisor.log'}" in errors[0]
    assert "--local-ray=embedded" in errors[0] and "IsADirectoryError" in result.stderr
    assert not list((tmp_path / "out").glob("part-*")) and read_state(place.directory) is None
