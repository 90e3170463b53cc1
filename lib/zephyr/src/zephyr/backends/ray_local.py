"""How the Ray backend starts an embedded (local, single-machine) Ray: fast and quiet.

An embedded Ray runs on this machine only, so its workers can use the driver's own
interpreter and packages. Ray's default when the driver runs under `uv run` is to start every
worker through `uv run` in the uploaded working directory: a second virtualenv built and
byte-compiled on each run (~15 s here) and a page of chatter. `workers_in_driver_env` turns
that off for the embedded Ray (workers get `sys.executable`, and the driver's script directory
and current directory on their path, as Ray does without a working directory); a user who set
`RAY_ENABLE_UV_RUN_RUNTIME_ENV` or a `runtime_env` with `py_executable` keeps what they chose.

`embedded_init_options` keeps Ray's dashboard off its default port 8265 (another Ray on this
machine, or the user's own `ray start`, may hold it) and Ray's INFO/WARNING lines out of the
console unless `verbose`; they stay in the session's log directory, which `describe_ray` names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

__all__ = ["describe_ray", "embedded_init_options", "free_port", "start_local_ray", "workers_in_driver_env"]

UV_HOOK_VARIABLE = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def embedded_init_options(verbose: bool) -> dict[str, Any]:
    """`ray.init` options for an embedded Ray: a free dashboard port, and quiet unless `verbose`."""
    options: dict[str, Any] = {"dashboard_port": free_port()}
    if not verbose:
        options["logging_level"] = logging.ERROR
    return options


@contextlib.contextmanager
def workers_in_driver_env(enabled: bool):
    """While `ray.init` runs: do not start workers through `uv run` (see the module docstring).

    Ray reads its switch once at import (`ray_constants`), so it is set on the imported module
    for the duration of the call, and in the environment for Ray's own child processes."""
    if not enabled or UV_HOOK_VARIABLE in os.environ:
        yield
        return
    from ray._private import ray_constants

    previous = ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    os.environ[UV_HOOK_VARIABLE] = "0"
    try:
        yield
    finally:
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = previous
        os.environ.pop(UV_HOOK_VARIABLE, None)


def describe_ray(context: Any, embedded: bool) -> str:
    """One line: which Ray, its dashboard, and (embedded) where its logs are."""
    dashboard = getattr(context, "dashboard_url", None)
    address = getattr(context, "address_info", {}) or {}
    parts = ["started a local Ray" if embedded else f"connected to Ray at {address.get('gcs_address') or '?'}"]
    if dashboard:
        parts.append(f"dashboard http://{dashboard}" if "://" not in dashboard else f"dashboard {dashboard}")
    session = address.get("session_dir")
    if embedded and session:
        parts.append(f"logs {session}/logs")
    return ", ".join(parts)


def start_local_ray(verbose: bool = False, **init_kwargs: Any) -> str:
    """`ray.init` an embedded Ray on this machine the fast, quiet way (see the module docstring);
    `init_kwargs` go to `ray.init` and win over these defaults. Returns one line saying where
    it is (dashboard URL, log directory), for the caller to print."""
    import ray

    kwargs = {"address": "local", **embedded_init_options(verbose), **init_kwargs}
    with workers_in_driver_env("py_executable" not in (init_kwargs.get("runtime_env") or {})):
        context = ray.init(**kwargs)
    return describe_ray(context, embedded=True)
