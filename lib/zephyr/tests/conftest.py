"""Zephyr test fixtures: the same behavioural suite runs on every backend."""

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
def local_backend():
    b = create_backend("sync", progress=False)
    yield b
    b.close()
