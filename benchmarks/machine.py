"""What a benchmark reports about the machine it ran on, and where it keeps its files."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator


def load_average() -> str:
    """The 1/5/15-minute load averages, to show how busy the machine was around a run."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict:
    """Cores, memory, and the versions that matter for the figures."""
    try:
        import ray
    except ImportError:  # an accelerator host that trains without Ray (bench_train.py --platform gpu)
        ray = None

    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "ram_gib": round(mem_gib, 1), "python": platform.python_version(),
            "ray": ray.__version__ if ray else None, "platform": platform.platform()}


@contextlib.contextmanager
def work_dir(path: str | None, prefix: str) -> Iterator[str]:
    """`path` if given (kept, so a later run reuses its corpus), else a temporary directory
    removed afterwards, however the run ends."""
    if path is not None:
        yield path
        return
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def start_local_ray(cores: int) -> None:
    """A private local Ray with `cores` CPUs, quiet, with no dashboard; its dashboard port is
    chosen free, not Ray's default 8265, which another user's Ray on the machine may hold."""
    import ray
    from zephyr.backends.ray_local import free_port

    ray.init(address="local", num_cpus=cores, include_dashboard=False, dashboard_port=free_port(),
             log_to_driver=False, configure_logging=False)
