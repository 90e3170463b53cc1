#!/usr/bin/env python
"""Make this machine as busy as a shared CI host, to check that the Ray suites hold under load.

    uv run python scripts/busy_machine.py start [--burners 3] [--state DIR]
    uv run pytest -m "ray or resilience"
    uv run python scripts/busy_machine.py stop [--state DIR]

`start` runs `--burners` CPU-bound processes (`while True: pass`) and a foreign Ray head started
with `ray start --head` on Ray's default ports (GCS 6379, dashboard 8265, ...) in a temp dir of
its own, as another user of the machine would. Their process-group ids go to `DIR/pids.json`.
`stop` ends exactly those process groups (and any process whose command line names the foreign
head's temp dir); it never runs `ray stop`, which would kill every Ray on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_STATE = Path(tempfile.gettempdir()) / "marin-busy-machine"


def start(state: Path, burners: int, ray_head: bool) -> None:
    state.mkdir(parents=True, exist_ok=True)
    if (state / "pids.json").exists():
        sys.exit(f"{state}/pids.json exists: run `stop` first")
    groups = []
    for _ in range(burners):
        proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        groups.append(proc.pid)
    temp_dir = None
    if ray_head:
        # a short path: Ray's unix socket paths must stay under ~107 characters
        temp_dir = tempfile.mkdtemp(prefix="busy-ray-")
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--temp-dir={temp_dir}",
                "--num-cpus=1", "--disable-usage-stats"]
        log = open(state / "foreign-ray.log", "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        groups.append(proc.pid)
    (state / "pids.json").write_text(json.dumps({"groups": groups, "ray_temp_dir": temp_dir}))
    if ray_head:
        _wait_for_port(6379, 120)
        print(f"foreign Ray head on 127.0.0.1:6379 (temp dir {temp_dir})")
    print(f"{burners} CPU burners; process groups {groups} recorded in {state}/pids.json")


def stop(state: Path) -> None:
    path = state / "pids.json"
    if not path.exists():
        print("nothing recorded")
        return
    record = json.loads(path.read_text())
    for group in record["groups"]:
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_group_alive(g) for g in record["groups"]):
        time.sleep(0.2)
    for group in record["groups"]:
        _signal_group(group, signal.SIGKILL)
    if record.get("ray_temp_dir"):
        for pid in _processes_naming(record["ray_temp_dir"]):  # Ray daemons that left the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(record["ray_temp_dir"], ignore_errors=True)  # the foreign head's sessions and logs
    path.unlink()
    print(f"stopped process groups {record['groups']}")


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _wait_for_port(port: int, timeout: float) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"the foreign Ray head did not listen on {port} within {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--burners", type=int, default=3, help="CPU-bound processes to start")
    parser.add_argument("--no-ray", action="store_true", help="do not start the foreign Ray head")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="where the process ids are recorded")
    args = parser.parse_args()
    if args.command == "start":
        start(args.state, args.burners, not args.no_ray)
    else:
        stop(args.state)


if __name__ == "__main__":
    main()
