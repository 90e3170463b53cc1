"""Zephyr test fixtures: the same behavioural suite runs on every backend."""

import tempfile

import pytest

from zephyr import create_backend


@pytest.fixture(params=["sync", "threadpool", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request):
    """A backend of each kind; `ray` runs on the shared local Ray of the test session."""
    if request.param == "ray":
        request.getfixturevalue("ray_shared")
    b = create_backend(request.param, max_parallelism=4, progress=False)
    yield b
    b.close()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """This process's temp dir (tempfile.gettempdir()) is an empty folder of its own."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


@pytest.fixture
def local_backend():
    b = create_backend("sync", progress=False)
    yield b
    b.close()


# ---- runs held in a known state (the status tests) ------------------------------------------------

GATE_DEADLINE = 120.0  # generous: a loaded 2-core machine


def gated(item):
    """A shard that waits until the test opens its gate (a file named after it).

    `item` is `(gates_dir, i, mishap)`: with mishap "raise" the first attempt raises a
    ValueError ("bad record in item i"), with "die" it kills its worker process (a lost task).
    Counts `docs/seen` and `docs/weight` (+i) for each attempt.
    """
    import os
    import time

    from zephyr import counters

    gates, i, mishap = item
    counters.increment("docs/seen")
    counters.increment("docs/weight", i)
    marker = f"{gates}/{mishap}-{i}"
    if mishap and not os.path.exists(marker):
        open(marker, "w").close()
        if mishap == "die":
            os._exit(1)  # the worker process dies, as on a preempted node
        raise ValueError(f"bad record in item {i}: unterminated string")
    deadline = time.monotonic() + GATE_DEADLINE
    while not os.path.exists(f"{gates}/{i}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {i} never opened")
        time.sleep(0.01)
    return {"i": i, "parity": i % 2}


class Gates:
    """A directory of gates for `gated` shards: `items()` to build the input, `open()` to release."""

    fn = staticmethod(gated)

    def __init__(self, directory):
        directory.mkdir(exist_ok=True)
        self.directory = directory

    def items(self, n: int, mishaps: dict | None = None) -> list[tuple]:
        return [(str(self.directory), i, (mishaps or {}).get(i, "")) for i in range(n)]

    def open(self, *indices: int) -> None:
        for i in indices:
            (self.directory / str(i)).touch()


@pytest.fixture
def gates(tmp_path):
    return Gates(tmp_path / "gates")


@pytest.fixture
def http_json():
    """`http_json(url, headers=None)`: GET a JSON document."""
    import json
    import urllib.request

    def get(url: str, headers: dict | None = None):
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return json.loads(response.read())

    return get
