"""`executor_main`: the command line of an experiment script, parsed by draccus.

    python experiments/hello_world.py --prefix /tmp/x [--dry_run true] [--force_run_failed true]
        [--run_only '["stats"]'] [--max_concurrent 4] [--executor_info_base_path DIR]
        [--dashboard true [--dashboard_port 8270]]

`--prefix` falls back to the MARIN_PREFIX environment variable. SIGINT (Ctrl-C) or SIGTERM stops
the run within seconds (see `marin.execution.runner`): the process exits with status 130 or 143
and the same command continues where it stopped. `--dashboard true` serves
Zephyr's live status page of the pipelines the steps run in this process (see docs/zephyr.md).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Sequence

import draccus
from zephyr.execution.interrupts import exit_after
from zephyr.status import start_dashboard

from marin.execution.runner import Executor, ExecutorInterrupted
from marin.execution.steps import ExecutorStep, InputName
from marin.logs import LOG_FORMAT, show_marin_lines

__all__ = ["ExecutorMainConfig", "executor_main"]

# "cluster" in a job's environment: its MARIN_PREFIX is the cluster's default, not the user's
# (marin.run.ray_run sets it when the submitter passed no `-e MARIN_PREFIX`)
PREFIX_SOURCE_ENV = "MARIN_PREFIX_SOURCE"

logger = logging.getLogger(__name__)

EXIT_DEADLINE = 10.0  # seconds into the shutdown of an interrupted run's process by which it exits, however stuck


@dataclass
class ExecutorMainConfig:
    """Options of an experiment run."""

    prefix: str | None = None
    """Where outputs go (a directory or gs:// URL); default: $MARIN_PREFIX."""
    executor_info_base_path: str | None = None
    """Where the experiment record (`<script>-<hash>.json`) goes; default: <prefix>/experiments."""
    dry_run: bool = False
    """Print what each step would do (run, skip, wait, fail, blocked) and run nothing."""
    force_run_failed: bool = False
    """Rerun steps that failed before instead of stopping with an error."""
    run_only: list[str] | None = None
    """Regexes of step names: run only those steps and the dependencies they need."""
    max_concurrent: int | None = 8
    """At most this many steps run at once; None (`--max_concurrent null`): every ready step starts."""
    lease_timeout: float = 60.0
    """Seconds without a heartbeat after which another executor takes a step over."""
    heartbeat_interval: float = 10.0
    """Seconds between lease heartbeats of a running step."""
    poll_interval: float = 5.0
    """Seconds between checks while another executor runs a step this one needs."""
    interrupt_grace: float = 10.0
    """After SIGINT/SIGTERM, seconds to wait for running steps to stop before leaving them behind."""
    dashboard: bool = False
    """Serve Zephyr's live status page of the pipelines steps run in this process; prints its URL."""
    dashboard_port: int = 0
    """Port of the status page (0: a free one)."""
    dashboard_host: str = "127.0.0.1"
    """Address the status page binds; any other than loopback requires the token printed with the URL."""


def executor_main(
    config_or_steps: ExecutorMainConfig | Sequence[ExecutorStep | InputName] | None = None,
    steps: Sequence[ExecutorStep | InputName] | None = None,
    description: str | None = None,
    args: Sequence[str] | None = None,
    config: ExecutorMainConfig | None = None,
) -> dict[str, str]:
    """Parse the command line (or `args`, or use `config`) and run or dry-run `steps`.

    Takes the calls Marin experiments make: `executor_main(steps=[...], description="...")`,
    `executor_main([...])`, and `executor_main(ExecutorMainConfig(prefix=...), steps=[...])`
    (a config skips the command line).
    Returns `{output_path: action}` for a dry run, else `{output_path: SUCCESS | SKIPPED}`.
    Raises `ExecutorError` when a step fails and `ValueError` when no prefix is given; on
    SIGINT or SIGTERM raises `SystemExit(130 or 143)` once the interrupted steps are recorded.
    """
    if isinstance(config_or_steps, ExecutorMainConfig):
        if config is not None:
            raise TypeError("executor_main got two configs (a positional one and config=)")
        config = config_or_steps
    elif config_or_steps is not None:
        if steps is not None:
            raise TypeError("executor_main got steps twice (positionally and as steps=)")
        steps = config_or_steps
    if steps is None:
        raise TypeError("executor_main needs steps: executor_main(steps=[step, ...])")
    if config is None:
        config = draccus.parse(config_class=ExecutorMainConfig, args=args)
    _show_executor_lines()
    prefix = config.prefix or os.environ.get("MARIN_PREFIX")
    if not prefix:
        raise ValueError("No output prefix: pass --prefix /path/or/gs://bucket/dir or set MARIN_PREFIX")
    _say_which_prefix(config.prefix)
    executor = Executor(
        prefix,
        max_concurrent=config.max_concurrent,
        force_run_failed=config.force_run_failed,
        lease_timeout=config.lease_timeout,
        heartbeat_interval=config.heartbeat_interval,
        poll_interval=config.poll_interval,
        interrupt_grace=config.interrupt_grace,
        description=description,
        executor_info_base_path=config.executor_info_base_path,
    )
    if config.dry_run:
        return executor.dry_run(steps, config.run_only)
    dashboard = _start_dashboard(config) if config.dashboard else None
    try:
        return executor.run(steps, config.run_only)
    except ExecutorInterrupted as e:
        logger.error("%s", e)
        # a step's thread (or its pool's) must not hold the exit; counted from the shutdown, so that a
        # caller that catches the SystemExit and goes on (a notebook, a test) is not ended later
        exit_after(EXIT_DEADLINE, e.exit_code, from_shutdown=True)
        raise SystemExit(e.exit_code) from e
    finally:
        if dashboard is not None:
            dashboard.stop()


def _say_which_prefix(prefix: str | None) -> None:
    """Warn when `--prefix` overrides a MARIN_PREFIX the user set; a cluster's default one (a job
    that `ray_run` submitted without `-e MARIN_PREFIX`: PREFIX_SOURCE_ENV=cluster) is overridden
    as a matter of course, which an INFO line says."""
    default = os.environ.get("MARIN_PREFIX")
    if not prefix or default in (None, prefix):
        return
    if os.environ.get(PREFIX_SOURCE_ENV) == "cluster":
        logger.info("writing under --prefix %s (the cluster's default, MARIN_PREFIX, is %s)", prefix, default)
    else:
        logger.warning("--prefix %s differs from MARIN_PREFIX=%s; using --prefix", prefix, default)


def _start_dashboard(config: ExecutorMainConfig):
    """Zephyr's status page for this run; its URL (with the token, off loopback) is printed once."""
    dashboard = start_dashboard(config.dashboard_host, config.dashboard_port)
    print(f"marin: zephyr status page at {dashboard.url}", file=sys.stderr, flush=True)
    return dashboard


def _show_executor_lines() -> None:
    """INFO lines of `marin.*` (which step runs, succeeds, is skipped) reach the console unless
    the program configured logging itself. A library may have put a WARNING-level handler on
    the root logger (absl does when JAX is imported), which would hide them: then `marin` gets
    its own handler."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    elif logging.getLogger("marin").getEffectiveLevel() > logging.INFO:
        show_marin_lines()
