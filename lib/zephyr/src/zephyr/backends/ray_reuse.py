"""A run on a local Ray that outlives it (`RayBackend(local_ray="reuse")`, the `zephyr` command's default).

Without an address, in this order:
1. a Ray that the user started with `ray start` on this machine, found through Ray's own
   address file (`<RAY_TMPDIR, TMPDIR or /tmp>/ray/ray_current_cluster`, as a plain `ray.init()`
   finds it) and answering there: used as it is, never stopped by zephyr;
2. zephyr's own head for this interpreter (`zephyr.backends.ray_head`), started by an earlier
   run and still up;
3. else such a head, started now: this run pays Ray's start-up, later ones do not.

A run connected to zephyr's head holds a lease on it until it ends (the head stops after its
idle time only when no run holds one). The workers of a Ray that outlives the run were started by
that Ray, not by this driver: so the driver's environment (but Ray's own `RAY_*` settings) goes
with the job as its `runtime_env` `env_vars`, and its working directory too (each worker enters
it, `enter_driver_cwd`), as an embedded Ray's workers would inherit both. A head that cannot be
started raises `LocalRayError` naming its logs.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, NamedTuple

from zephyr.backends.ray_head import HeadState, Lease, age_text, head_dir, running_head, start_head, stop_head
from zephyr.backends.ray_local import workers_in_driver_env
from zephyr.backends.ray_warm import STAMP_VARIABLE, code_stamp

__all__ = ["CWD_VARIABLE", "Reused", "connect_reused", "enter_driver_cwd", "job_runtime_env", "ray_start_address"]

logger = logging.getLogger("zephyr")

CWD_VARIABLE = "ZEPHYR_DRIVER_CWD"
SETUP_HOOK = "zephyr.backends.ray_reuse.enter_driver_cwd"
STOP_HINT = "`zephyr ray stop`"


def gcs_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts connections at `address` (host:port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def ray_start_address() -> tuple[str, str] | None:
    """The address `ray start` last wrote in Ray's address file if a GCS answers there, with the file."""
    from ray._common.utils import get_ray_address_file

    path = get_ray_address_file(None)
    try:
        address = Path(path).read_text().strip()
    except OSError:
        return None
    return (address, path) if gcs_answers(address) else None  # else stale: that Ray is gone


class Reused(NamedTuple):
    """A connection to a local Ray that outlives the run."""

    where: str  # the line that says which Ray
    lease: Lease | None  # to release when the run ends; None on a `ray start` Ray
    head: HeadState | None  # zephyr's head; None on a `ray start` Ray


def connect_reused(verbose: bool, init_kwargs: dict[str, Any]) -> Reused:
    """Connect this driver to a local Ray that outlives the run (see the module docstring).
    Raises LocalRayError when zephyr's head could not be started."""
    kwargs = {**({} if verbose else {"logging_level": logging.ERROR}), **init_kwargs}
    found = ray_start_address()
    if found is not None:
        address, path = found
        _connect(address, None, kwargs)
        return Reused(f"using the Ray at {address} that `ray start` runs (found in {path}); zephyr leaves it running", None, None)
    directory = head_dir()
    lease = Lease(directory)  # before reading the state: see zephyr.backends.ray_head_serve
    try:
        state = running_head(directory)
        if state is not None and not gcs_answers(state.gcs_address):  # its node died behind our back
            logger.info("zephyr: the local Ray at %s does not answer; starting a fresh one", state.gcs_address)
            stop_head(directory)
            state = None
        reused = state is not None
        state = state or start_head(directory)
        _connect(state.gcs_address, state.token_path, kwargs)
    except BaseException:
        lease.release()
        raise
    return Reused(describe_head(state, reused), lease, state)


def describe_head(state: HeadState, reused: bool) -> str:
    """The one line a run prints: which Ray, where its logs are, how it stops."""
    logs = f"logs {state.session_dir}/logs" if state.session_dir else f"temp dir {state.temp_dir}"
    stop = f"it stops after {state.idle_s / 60:g} min unused, or now with {STOP_HINT}"
    if reused:
        return f"reusing the local Ray at {state.gcs_address}, started {age_text(state.started_at)} ago ({logs}); {stop}"
    return f"started a local Ray at {state.gcs_address} that later runs reuse ({logs}); {stop}"


def job_runtime_env(runtime_env: dict | None) -> dict:
    """`runtime_env` (the user's, which wins) with this driver's environment and working directory
    for the job's workers."""
    runtime_env = dict(runtime_env or {})
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "__RAY"))}
    env_vars[CWD_VARIABLE] = os.getcwd()
    env_vars[STAMP_VARIABLE] = code_stamp()  # see zephyr.backends.ray_warm
    runtime_env["env_vars"] = {**env_vars, **(runtime_env.get("env_vars") or {})}
    if "worker_process_setup_hook" in runtime_env:
        logger.warning("zephyr: runtime_env has its own worker_process_setup_hook; the workers start in the Ray's "
                       "directory, not in %s", os.getcwd())
    else:
        runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    return runtime_env


def enter_driver_cwd() -> None:
    """Ray's worker setup hook: enter the driver's working directory, as an embedded Ray's workers start there."""
    directory = os.environ.get(CWD_VARIABLE)
    if directory and os.path.isdir(directory):
        os.chdir(directory)


def _connect(address: str, token_path: str | None, init_kwargs: dict[str, Any]) -> None:
    """`ray.init` on a Ray that outlives the run, with the driver's environment and working
    directory for the job's workers. Zephyr's head: with its token (this process's Ray config is
    reloaded for it, the environment is put back after). A `ray start` Ray: token authentication
    as Ray's own `ray.init()` finds it for a Ray it finds itself (a token at hand turns it on)."""
    import ray
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    from ray._raylet import AuthenticationTokenLoader, Config

    kwargs = {**init_kwargs, "runtime_env": job_runtime_env(init_kwargs.get("runtime_env"))}
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path, "RAY_AUTH_TOKEN": None} if token_path else {}
    saved = {k: os.environ.get(k) for k in auth}
    _set_environment(auth)
    try:
        if not token_path:
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        Config.initialize("")  # Ray read its auth mode when it was imported
        AuthenticationTokenLoader.instance().reset_cache()
        with workers_in_driver_env("py_executable" not in kwargs["runtime_env"]):
            ray.init(address=address, **kwargs)
    finally:
        _set_environment(saved)


def _set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
