"""marin.cluster.procfs against real processes: found by their environment tag, their session
and the port they listen on, and ended by signal_all (Linux /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from marin.cluster import procfs

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads Linux /proc")

_LISTEN = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
           "print(s.getsockname()[1], flush=True); time.sleep(600)")


@pytest.fixture
def tagged_listener(tmp_path):
    """A process in a session of its own, tagged TEST_PROCFS_TAG=<random>, listening on a port."""
    entry = f"TEST_PROCFS_TAG={uuid.uuid4().hex}"
    env = {**os.environ, entry.split("=")[0]: entry.split("=")[1]}
    proc = subprocess.Popen([sys.executable, "-c", _LISTEN, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        yield proc, entry.encode(), int(proc.stdout.readline())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_process_is_found_by_its_tag_session_port_and_command_line(tagged_listener, tmp_path):
    proc, entry, port = tagged_listener
    assert procfs.find_processes(env_entry=entry) == [proc.pid]
    assert procfs.find_processes(sessions=[proc.pid]) == [proc.pid]  # it leads its own session
    assert procfs.has_env_entry(proc.pid, entry) and not procfs.has_env_entry(proc.pid, entry + b"x")
    assert procfs.cmdline_contains(proc.pid, str(tmp_path))
    assert procfs.listeners({port, 1}) == {port: [proc.pid]}


def test_signal_all_ends_the_processes_and_skips_the_ones_gone(tagged_listener):
    proc, entry, _ = tagged_listener
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    procfs.signal_all([gone.pid, proc.pid], signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert procfs.find_processes(env_entry=entry) == []
