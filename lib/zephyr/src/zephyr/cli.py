"""The `zephyr` command: run a pipeline script with a chosen backend installed.

    uv run zephyr --backend=ray --max-parallelism=200 --memory=2GB script.py [script args...]

The script runs in this process with `flow_backend()` returning the backend built from the
options. A script without an `if __name__ == "__main__":` block has its entry point
(`--entry-point`, default `main`) called after it loads (plain `python script.py` does not call
it, and says so at exit: `zephyr.execution.uncalled_main`). Everything after the script path
goes to the script, except zephyr's own options that change where or how it runs (`--backend`,
`--max-parallelism`, `--memory`, ...): there they are refused with the corrected command, since
they would silently do nothing; after `script.py --` every argument is the script's. `--cluster NAME` submits the same command to a Ray cluster as a job
through Marin's job launcher instead (SIGINT or SIGTERM then stops the job). `--dashboard[=PORT]` serves a live status page of the
script's pipelines while it runs. SIGINT (Ctrl-C) or SIGTERM stops the script: its running
pipeline cancels its in-flight tasks and the command exits with 130 or 143 (see docs/zephyr.md).

    zephyr status URL_OR_RECORD [--json]     print a run's state (see zephyr.status.commands)
    zephyr dashboard RECORD [--html FILE]    serve (or save) a finished run's page again
    zephyr verify DIR                        check DIR's outputs against its run record
    zephyr ray status | stop                 the local Ray that `--backend=ray` runs leave for reuse

Without `--address` (or `RAY_ADDRESS`), `--backend=ray` reuses a local Ray (`--local-ray=reuse`,
the default, or `$ZEPHYR_LOCAL_RAY`): the first run starts one that outlives it, later runs
connect to it (see zephyr.backends.ray_reuse); `--local-ray=embedded` starts a Ray inside the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from zephyr.backends import Backend, backend_names, create_backend, set_flow_backend
from zephyr.backends.ray_head import LocalRayError
from zephyr.backends.ray_head_commands import ray_main
from zephyr.errors import InputNotFoundError, PlanError, ShardError
from zephyr.execution.quarantine import (DEFAULT_MAX_QUARANTINED, ON_SHARD_FAILURE, QuarantinedShardsError, QuarantineLimitError,
                                         check_max_quarantined)
from zephyr.execution.run_lock import OutputBusyError
from zephyr.execution.interrupts import clear_interrupted, exit_after, handling_signals, raise_interrupted, signal_name
from zephyr.execution.summary import format_summary
from zephyr.execution.uncalled_main import has_main_guard
from zephyr.resources import amount_argument, memory_argument
from collections import Counter
from zephyr.status import port_number
from zephyr.status import start_dashboard
import importlib.util

__all__ = ["main"]

EPILOG = """examples:
  zephyr --backend=ray --max-parallelism=200 --memory=2GB script.py
  zephyr --backend=sync --dry-run script.py --input gs://bucket/raw
  zephyr --backend=ray --resources '{"TPU": 4, "TPU-v4-8-head": 1}' train_prep.py
  zephyr --cluster us-central2 --backend=ray script.py   # submit as a Ray job
  zephyr --backend=ray --dashboard script.py              # live status page; prints its URL
  zephyr status http://127.0.0.1:8270/                    # that page's state, in the terminal
  zephyr status gs://bucket/clean/                        # a finished run, from its .zephyr-run.json
  zephyr --on-shard-failure=quarantine script.py          # set poison shards aside; exit 3 listing them
  zephyr verify gs://bucket/clean/                        # every recorded output there, whole, and nothing else
  zephyr ray stop                                         # stop the local Ray that --backend=ray runs reuse
"""

EXIT_QUARANTINED = 3  # the run finished, except the shards it quarantined
EXIT_DEADLINE = 30.0  # seconds after SIGINT/SIGTERM: cancel, drain (at most 10 s), close the backend, exit
# With --cluster: seconds after the first signal for the job launcher to stop the job and end, after
# which it is killed (its own stop request gives up after 30 s: MARIN_STOP_REQUEST_TIMEOUT)
LAUNCHER_STOP_DEADLINE = float(os.environ.get("ZEPHYR_LAUNCHER_STOP_DEADLINE", "60"))

_SUBCOMMANDS = {"status": "status_main", "dashboard": "dashboard_main", "verify": "verify_main"}
LOCAL_RAY_ENV = "ZEPHYR_LOCAL_RAY"  # the default of --local-ray
LOCAL_RAY = ("reuse", "embedded")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _port(text: str) -> int:
    try:
        return port_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; write --dashboard=8270, or --dashboard alone for a free port") from None


def _bare_dashboard(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--dashboard` without `=PORT` means a free port. Rewritten `--dashboard=0` up to the script
    path, so that argparse never takes the script for a port and the script's own flags stay its own."""
    takes_value = {s for a in parser._actions for s in a.option_strings if a.nargs is None and s != "--dashboard"}
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--dashboard":
            if i + 1 < len(argv) and argv[i + 1].isdigit():  # `--dashboard 8270` works too
                arg, i = f"--dashboard={argv[i + 1]}", i + 1
            out.append(arg if arg != "--dashboard" else "--dashboard=0")
        elif arg in takes_value:
            out.extend(argv[i : i + 2])
            i += 1
        elif arg == "--" or not arg.startswith("-"):
            return out + argv[i:]  # the script path: the rest belongs to it
        else:
            out.append(arg)
        i += 1
    return out


# Options of ours that a script rarely takes and that change where or how it runs: after the script
# they are refused with the corrected command (a script that does take one gets it after `--`).
_MISPLACED = ("--backend", "--max-parallelism", "--memory", "--num-cpus", "--num-gpus", "--resources", "--address", "--local-ray",
              "--scratch-dir", "--on-shard-failure", "--max-quarantined", "--cluster", "--dry-run", "--entry-point",
              "--dashboard", "--dashboard-host")


def _max_quarantined(text: str) -> int | float | None:
    """`--max-quarantined`: 'none', a count of shards, or a fraction of a stage's shards."""
    if text.lower() == "none":
        return None
    try:
        value = float(text) if "." in text else int(text)
        return check_max_quarantined(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a count (5), a fraction (0.02) or 'none', got {text!r}") from e


def _misplaced_options(script_args: list[str]) -> list[int]:
    """Indices of the arguments after the script that are one of `_MISPLACED` (with its value)."""
    found: list[int] = []
    for i, arg in enumerate(script_args):
        if arg == "--":
            break  # the rest is the script's, whatever it says
        if arg.split("=", 1)[0] in _MISPLACED:
            found.append(i)
            if "=" not in arg and arg not in ("--dry-run", "--dashboard") and i + 1 < len(script_args):
                found.append(i + 1)
    return found


def _corrected_command(before: list[str], script: str, script_args: list[str], misplaced: list[int]) -> str:
    """The same command with the misplaced options moved before the script."""
    moved = [script_args[i] for i in misplaced]
    kept = [a for i, a in enumerate(script_args) if i not in misplaced]
    return shlex.join(["zephyr", *before, *moved, script, *kept])


def _resources(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f'expected JSON like \'{{"TPU": 4}}\', got {text!r} ({e})') from None
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) for v in value.values()):
        raise argparse.ArgumentTypeError(f'expected a JSON object of amounts like \'{{"TPU": 4}}\', got {text!r}')
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zephyr",
        description="Run a Zephyr pipeline script on a chosen backend.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=backend_names(), default="ray", help="where shards run (default: ray)")
    parser.add_argument("--max-parallelism", type=_positive_int, default=None, help="most shards running at once")
    parser.add_argument("--memory", type=memory_argument, default=None, help="memory per task, e.g. 2GB, 512MiB or bytes")
    parser.add_argument("--num-cpus", type=amount_argument, default=1.0, help="CPUs per task (default 1)")
    parser.add_argument("--num-gpus", type=amount_argument, default=0.0, help="GPUs per task (default 0)")
    parser.add_argument(
        "--price-per-core-hour", type=amount_argument, default=None, metavar="PRICE",
        help="what a core-hour costs: each stage's CPU seconds are priced in the summary, the status page and the "
        "run record (default: $ZEPHYR_PRICE_PER_CORE_HOUR, else unpriced)",
    )
    parser.add_argument("--resources", type=_resources, default=None, help='custom Ray resources per task as JSON, e.g. \'{"TPU": 4}\'')
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local Ray: --local-ray)")
    parser.add_argument(
        "--local-ray", choices=LOCAL_RAY, default=None,
        help="without an address: 'reuse' connects to a local Ray left running by an earlier run (or a `ray start`), "
        "starting one for later runs if none runs (`zephyr ray stop` stops it; it stops by itself after "
        "$ZEPHYR_RAY_IDLE_MINUTES, default 30, unused); 'embedded' starts a Ray inside this run and stops it at the end "
        f"(default: ${LOCAL_RAY_ENV}, else reuse)",
    )
    parser.add_argument(
        "--scratch-dir", default=None,
        help="where shuffles spill (default: $ZEPHYR_SCRATCH_DIR, else .zephyr-scratch beside the output); "
        "on a multi-node cluster, storage every worker sees, e.g. gs://bucket/scratch",
    )
    parser.add_argument(
        "--on-shard-failure", choices=ON_SHARD_FAILURE, default="fail",
        help="what a shard that fails on every attempt does: 'fail' ends the run (default); 'quarantine' sets it "
        f"aside with its error, runs everything else, and exits {EXIT_QUARANTINED} with the list",
    )
    parser.add_argument(
        "--max-quarantined", type=_max_quarantined, default=DEFAULT_MAX_QUARANTINED,
        help="with --on-shard-failure=quarantine, how many of a stage's shards may be set aside before the run stops "
        f"(its code, not its input, is then likely at fault): a count (5), a fraction of the stage's shards (0.02), or "
        f"'none' for no limit; default {DEFAULT_MAX_QUARANTINED} (at least one shard)",
    )
    parser.add_argument("--cluster", default=None, help="submit to this Marin cluster (name or config yaml) as a Ray job")
    parser.add_argument("--dry-run", action="store_true", help="print the plan of every pipeline the script executes; run nothing")
    parser.add_argument("--entry-point", default=None, help="function to call after loading the script (default: main, if defined)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars and no end-of-run summary")
    parser.add_argument("--verbose", action="store_true", help="show Ray's own log lines on the console (default: in its log files)")
    parser.add_argument(
        "--dashboard", type=_port, default=None, metavar="PORT",
        help="serve a live status page while the script runs and print its URL; write --dashboard=PORT to choose "
        "the port (default: a free one)",
    )
    parser.add_argument(
        "--dashboard-host", default="127.0.0.1",
        help="address the status page binds (default 127.0.0.1; any other address requires the token printed with the URL)",
    )
    parser.add_argument("script", help="the pipeline script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed on to the script")
    return parser


class DryRunBackend(Backend):
    """Prints each pipeline's plan instead of running it; `execute` yields nothing."""

    name = "dry-run"
    plans_only = True  # ZephyrContext.execute hands it the dataset rather than running tasks on it

    def __init__(self, target: str, out=None):
        super().__init__(1)
        self.target = target
        self.out = out or sys.stdout
        self.plans: list[str] = []

    def execute(self, dataset):
        text = dataset.plan().describe()
        self.plans.append(text)
        print(f"[dry-run on {self.target}] {text}", file=self.out, flush=True)
        return _NothingRun()

    def submit(self, fn, shared, arg):  # pragma: no cover - execute never submits
        raise RuntimeError("dry-run backend runs nothing")

    def wait(self, handles, timeout=None):  # pragma: no cover
        return list(handles)

    def result(self, handle):  # pragma: no cover
        raise RuntimeError("dry-run backend runs nothing")


class _NothingRun:
    """What a dry run's `execute` returns: no results, empty counters and stats, like a run."""

    def __init__(self):
        self.counters = Counter()
        self.stats: list = []
        self.finished = True

    def __iter__(self):
        return self

    def __next__(self):
        raise StopIteration


def _run_script(path: str, script_args: list[str], entry_point: str | None) -> None:
    guarded = has_main_guard(path)
    sys.argv = [path, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    namespace = runpy.run_path(path, run_name="__main__")
    if guarded and entry_point is None:
        return
    name = entry_point or "main"
    fn = namespace.get(name)
    if callable(fn):
        fn()
    elif entry_point is not None:
        raise SystemExit(f"zephyr: error: {path} defines no function {entry_point!r} to call (--entry-point)")


def _submit_to_cluster(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Re-run this same command on a cluster as a Ray job through `marin.run.ray_run`.

    SIGINT or SIGTERM stops the job, as it stops a local run (the job's zephyr cancels its tasks):
    the launcher runs with `--auto-stop` in a session of its own, gets a SIGTERM from here on the
    first signal (once, so that a second cannot cut its stop request short; SIGTERM because a
    SIGINT that was ignored when this command started stays ignored in the launcher), and is
    waited for, `LAUNCHER_STOP_DEADLINE` seconds at most. Before, a SIGTERM left the launcher
    behind, streaming logs of a job that kept running.
    """
    forwarded = _without_cluster_option(list(argv))
    job_id = "raysubmit_" + secrets.token_hex(8)  # Ray's form; chosen here, so a message can name the job
    command = [sys.executable, "-m", "marin.run.ray_run", "--cluster", args.cluster, "--auto-stop",
               "--submission-id", job_id, "--", "python", "-m", "zephyr", *forwarded]
    print(f"zephyr: submitting to cluster {args.cluster}: {shlex.join(command[2:])}", file=sys.stderr)
    try:
        launcher = subprocess.Popen(command, start_new_session=True)
    except FileNotFoundError as e:
        raise SystemExit(f"zephyr: error: cannot launch the job submitter: {e}") from None
    received: list[int] = []

    def pass_on(signum, frame):
        if not received:
            print(f"zephyr: {signal_name(signum)}: stopping the job", file=sys.stderr, flush=True)
            launcher.send_signal(signal.SIGTERM)
        received.append(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = _wait_for_launcher(launcher, received, LAUNCHER_STOP_DEADLINE, args.cluster, job_id)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else code


def _wait_for_launcher(launcher: subprocess.Popen, received: list[int], deadline_s: float, cluster: str,
                       job_id: str) -> int | None:
    """Wait for the launcher; once a signal was passed on, for `deadline_s` seconds at most.

    A launcher that does not end by then (its job server does not answer, or it is stuck) is
    killed with its session, and the user is told how to make sure the job stopped: a stopping
    command must end, on a preemptible machine it has seconds.
    """
    stop_by = None
    while True:
        try:
            return launcher.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if received and stop_by is None:
            stop_by = time.monotonic() + deadline_s
        if stop_by is not None and time.monotonic() > stop_by:
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)  # it leads its own session
    launcher.wait()
    print(f"zephyr: the job launcher had not ended {deadline_s:.0f}s after it was asked to stop the job, and was "
          f"killed; job {job_id} may still be running: `marin cluster --cluster {cluster} stop-job {job_id}` "
          "stops it", file=sys.stderr, flush=True)
    return None


def _without_cluster_option(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--cluster":
            skip = True
            continue
        if arg.startswith("--cluster="):
            continue
        out.append(arg)
    return out


def make_backend(args: argparse.Namespace) -> Backend:
    options = dict(
        memory=args.memory,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        resources=args.resources,
        progress=False if args.quiet else None,
        scratch_dir=args.scratch_dir,
        on_shard_failure=args.on_shard_failure,
        max_quarantined=args.max_quarantined,
        price_per_core_hour=args.price_per_core_hour,
    )
    if args.backend == "ray":
        options["address"] = args.address
        options["verbose"] = args.verbose
        options["local_ray"] = _local_ray(args.local_ray)
    elif args.address:
        raise argparse.ArgumentTypeError("--address only applies to --backend=ray")
    elif args.local_ray:
        raise argparse.ArgumentTypeError("--local-ray only applies to --backend=ray")
    return create_backend(args.backend, args.max_parallelism, **options)


def _local_ray(chosen: str | None) -> str:
    """--local-ray, else $ZEPHYR_LOCAL_RAY, else reuse."""
    value = chosen or os.environ.get(LOCAL_RAY_ENV) or "reuse"
    if value not in LOCAL_RAY:
        raise ValueError(f"{LOCAL_RAY_ENV} must be one of {', '.join(LOCAL_RAY)}; got {value!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ray"] and not os.path.isfile("ray"):

        return ray_main(argv[1:])
    if argv and argv[0] in _SUBCOMMANDS and not os.path.isfile(argv[0]):
        from zephyr.status import commands  # the status page server (aiohttp): only for these commands

        return getattr(commands, _SUBCOMMANDS[argv[0]])(argv[1:])
    parser = build_parser()
    argv = _bare_dashboard(argv, parser)
    args = parser.parse_args(argv)
    if not os.path.isfile(args.script):
        parser.error(f"script not found: {args.script}")
    at = len(argv) - len(args.script_args) - 1  # where the script is (argparse may drop a `--` after it)
    explicit = argv[at] != args.script
    at -= explicit
    misplaced = [] if explicit else _misplaced_options(args.script_args)
    if misplaced:
        before = argv[:at]
        parser.error(
            f"{' '.join(args.script_args[i] for i in misplaced)} after the script would go to the script, not to zephyr; "
            f"put zephyr's options before the script:\n  {_corrected_command(before, args.script, args.script_args, misplaced)}\n"
            f"(to pass them to the script itself, write `--` after the script: zephyr ... {args.script} -- ARGS)"
        )
    if args.cluster:
        if importlib_missing("marin"):
            parser.error("--cluster needs the `marin` package (its job launcher marin.run.ray_run) installed")
        return _submit_to_cluster(args, argv)
    if args.dry_run:
        backend: Backend = DryRunBackend(args.backend)
    else:
        try:
            backend = make_backend(args)
        except (ValueError, argparse.ArgumentTypeError) as e:
            parser.error(str(e))
        if not args.quiet:
            backend.on_finish.append(lambda execution: print(format_summary(execution), file=sys.stderr, flush=True))
            for_start = getattr(backend, "on_start", None)
            if for_start is not None:
                for_start.append(lambda where: print(f"zephyr: {where}", file=sys.stderr, flush=True))
    dashboard = None
    if args.dashboard is not None and not args.dry_run:
        dashboard = _start_dashboard(parser, args.dashboard_host, args.dashboard)
    set_flow_backend(backend)
    stop = _StopOnce()
    with handling_signals(stop):
        try:
            _run_script(args.script, args.script_args, args.entry_point)
        except QuarantinedShardsError as e:
            print(f"zephyr: error: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_QUARANTINED
        except (ShardError, PlanError, InputNotFoundError, OutputBusyError, QuarantineLimitError, LocalRayError) as e:  # one line
            print(f"zephyr: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ray's waits re-raise a signal's exception as a bare KeyboardInterrupt
            clear_interrupted()
            signum = stop.signum or signal.SIGINT
            print(f"zephyr: interrupted by {signal_name(signum)}: in-flight tasks were cancelled; the outputs written "
                  "so far are complete; run the same command again to resume", file=sys.stderr)
            return 128 + signum
        finally:
            set_flow_backend(None)
            backend.close()
            if dashboard is not None:
                dashboard.stop()
    return 0


class _StopOnce:
    """SIGINT or SIGTERM: the first raises `Interrupted` in the script (the runner cancels its
    tasks on the way out); later ones are noted and ignored, so that the cleanup finishes."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum: int) -> None:
        if self.signum is not None:
            print(f"zephyr: {signal_name(signum)}: already stopping (cancelling tasks); SIGKILL stops at once",
                  file=sys.stderr, flush=True)
            return
        self.signum = signum
        exit_after(EXIT_DEADLINE, 128 + signum)  # a shard blocked in C must not hold the exit forever
        raise_interrupted(signum)  # raised again by the run if Python drops it where it lands


def _start_dashboard(parser: argparse.ArgumentParser, host: str, port: int):
    """Start the status page and print its URL, once (it holds the token off loopback)."""
    try:
        dashboard = start_dashboard(host, port)
    except OSError as e:
        parser.error(f"--dashboard: {e}")
    note = " (requires the token in this URL; it is not shown again)" if dashboard.requires_token else ""
    print(f"zephyr: status page at {dashboard.url}{note}", file=sys.stderr, flush=True)
    return dashboard


def importlib_missing(name: str) -> bool:
    return importlib.util.find_spec(name) is None


if __name__ == "__main__":
    sys.exit(main())
