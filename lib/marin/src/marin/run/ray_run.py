"""Submit a command as a Ray job: `python -m marin.run.ray_run [options] -- <command>`.

The job gets a runtime environment built here: the current directory as working dir (minus
what does not belong in a job package; refused with a clear error before submission when it
exceeds Ray's package limit), the requested environment variables, and pinned dependencies
exported from the project's `uv.lock` for the requested extras. It is submitted through Ray's
job API with the cluster's token, its logs are streamed unless `--no_wait`, and the exit
status is non-zero when the job fails.

Examples:
    python -m marin.run.ray_run --cluster local -- python experiments/hello_world.py
    python -m marin.run.ray_run --cluster us-central2 --tpu v4-8 -e WANDB_API_KEY -- python train.py
    python -m marin.run.ray_run --cluster infra/marin-us-east5.yaml --no_wait --extra tpu -- python x.py
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import re
import shlex
import secrets
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephyr.resources import amount_argument, memory_argument, parse_memory  # parse_memory: re-exported, one parser for both

from marin.cluster import jobs, local
from marin.cluster.auth import read_token, redact
from marin.cluster.target import Target, connect, job_client, known_tokens, resolve_target
from marin.tpu.slices import tpu_head_resource  # re-exported: the job's TPU option names a slice head

__all__ = [
    "DEFAULT_EXCLUDES",
    "JobRequest",
    "build_parser",
    "build_runtime_env",
    "check_package_size",
    "main",
    "new_submission_id",
    "parse_env_vars",
    "parse_memory",
    "pinned_requirements",
    "submit",
    "tpu_head_resource",
]

# Never shipped with a job: VCS metadata, environments, caches, build outputs, bulk data.
DEFAULT_EXCLUDES = [
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "node_modules",
    "*.egg-info",
    "/build/",
    "/dist/",
    "/scratch/",
    "/data/",
    "/wandb/",
    "/checkpoints/",
    "*.parquet",
    "*.zst",
    "*.gz",
    "*.tar",
    "*.safetensors",
    "*.ckpt",
    "*.pt",
    "*.npy",
]
WORKING_DIR_KEY = "marin_working_dir"
_DEFAULT_MAX_PACKAGE = 512 * 1024 * 1024


def parse_env_vars(items: Sequence[Sequence[str]]) -> dict[str, str]:
    """`-e KEY VALUE`, `-e KEY=VALUE`, or `-e KEY` (value taken from this environment)."""
    env: dict[str, str] = {}
    for item in items:
        if len(item) == 2:
            key, value = item
        elif len(item) == 1 and "=" in item[0]:
            key, value = item[0].split("=", 1)
        elif len(item) == 1:
            key = item[0]
            if key not in os.environ:
                raise ValueError(f"-e {key}: no value given and {key} is not set in this environment")
            value = os.environ[key]
        else:
            raise ValueError(f"-e takes KEY VALUE or KEY=VALUE; got {len(item)} values for {item[0]!r}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"Invalid environment variable name {key!r}")
        env[key] = value
    return env


def _excluded(rel: str, is_dir: bool, patterns: Sequence[str]) -> bool:
    """A gitignore-like match, enough for the patterns above and simple user ones."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        core = pattern.strip("/")
        if dir_only and not is_dir:
            continue
        if pattern.startswith("/") or "/" in core:
            if fnmatch.fnmatchcase(rel, core):
                return True
        elif fnmatch.fnmatchcase(name, core):
            return True
    return False


def package_size(directory: Path, excludes: Sequence[str]) -> tuple[int, list[tuple[int, str]]]:
    """Bytes Ray would package from `directory` (it stores files uncompressed), and the biggest entries.

    Symlinks count as what they point to (Ray's zip follows them, to files and directories);
    a directory reached twice through links (a loop) is counted once.
    """
    total = 0
    biggest: dict[str, int] = {}
    seen_dirs: set[str] = set()
    for root, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen_dirs:
            dirs[:] = []
            continue
        seen_dirs.add(real)
        rel_root = os.path.relpath(root, directory)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not _excluded(rel_root + d, True, excludes)]
        for name in files:
            rel = rel_root + name
            if _excluded(rel, False, excludes):
                continue
            try:
                size = os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
            total += size
            top = rel.split("/", 1)[0]
            biggest[top] = biggest.get(top, 0) + size
    top_entries = sorted(((size, name) for name, size in biggest.items()), reverse=True)[:5]
    return total, top_entries


def max_package_bytes() -> int:
    if env := os.environ.get("MARIN_MAX_PACKAGE_BYTES"):
        return int(env)
    try:
        from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

        return int(GCS_STORAGE_MAX_SIZE)
    except ImportError:
        return _DEFAULT_MAX_PACKAGE


def check_package_size(directory: Path, excludes: Sequence[str]) -> int:
    """The package size; raises ValueError naming the biggest entries when it exceeds Ray's limit."""
    total, top = package_size(directory, excludes)
    limit = max_package_bytes()
    if total >= limit:
        listing = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for size, name in top)
        raise ValueError(
            f"The job's working directory {directory} packs to {total / 2**20:.1f} MiB, over Ray's limit of "
            f"{limit / 2**20:.0f} MiB. Biggest entries: {listing}. Exclude them with --exclude PATTERN "
            f"(gitignore syntax) or move data to the cluster's bucket."
        )
    return total


def _gitignore_patterns(directory: Path) -> list[str]:
    path = directory / ".gitignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith(("#", "!"))]


def _lock_root(start: Path) -> Path | None:
    for parent in (start, *start.parents):
        if (parent / "uv.lock").is_file():
            return parent
    return None


def pinned_requirements(extras: Sequence[str], project_dir: Path, package: str = "marin") -> list[str]:
    """Pinned requirements of `package` with `extras`, exported from the workspace's `uv.lock`."""
    # The working dir's project first, else the workspace this package comes from.
    root = _lock_root(project_dir.resolve()) or _lock_root(Path(__file__).resolve().parent)
    if root is None:
        raise FileNotFoundError(f"No uv.lock above {project_dir}: cannot pin dependencies for --extra")
    argv = ["uv", "export", "--frozen", "--no-hashes", "--no-emit-workspace", "--no-header", "--no-annotate"]
    argv += ["--no-dev", "--package", package, *(f"--extra={extra}" for extra in extras)]
    result = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)}` failed: {result.stderr.strip()[-1000:]}")
    requirements = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-e", "-")):
            requirements.append(line)
    return requirements


def _workspace_pythonpath(directory: Path) -> str | None:
    """Relative `lib/*/src` dirs of a uv workspace, so the job imports the shipped sources."""
    sources = sorted(p.relative_to(directory).as_posix() for p in directory.glob("lib/*/src") if p.is_dir())
    return os.pathsep.join(sources) if sources else None


@dataclass
class JobRequest:
    """Everything `submit` needs, built from the command line."""

    command: list[str]
    working_dir: Path
    env_vars: dict[str, str] = field(default_factory=dict)
    extras: list[str] = field(default_factory=list)
    pip_deps: list[str] = field(default_factory=list)
    excludes: list[str] = field(default_factory=list)
    tpu: str | None = None
    entrypoint_num_cpus: float | None = None
    entrypoint_memory: int | None = None
    submission_id: str | None = None
    cluster_name: str | None = None

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.command)

    def entrypoint_resources(self) -> dict[str, float] | None:
        return {tpu_head_resource(self.tpu): 1} if self.tpu else None


def build_runtime_env(request: JobRequest) -> dict[str, Any]:
    """The runtime env of the job; raises ValueError before anything is uploaded if too big."""
    excludes = [*DEFAULT_EXCLUDES, *_gitignore_patterns(request.working_dir), *request.excludes]
    check_package_size(request.working_dir, excludes)
    env_vars = dict(request.env_vars)
    if "MARIN_PREFIX" not in env_vars:  # a MARIN_PREFIX the job sees is then the cluster's, not the user's:
        env_vars.setdefault("MARIN_PREFIX_SOURCE", "cluster")  # marin.execution.main.PREFIX_SOURCE_ENV
    if "PYTHONPATH" not in env_vars and (pythonpath := _workspace_pythonpath(request.working_dir)):
        env_vars["PYTHONPATH"] = pythonpath
    runtime_env: dict[str, Any] = {"working_dir": str(request.working_dir), "excludes": excludes}
    if env_vars:
        runtime_env["env_vars"] = env_vars
    packages = pinned_requirements(request.extras, request.working_dir) if request.extras else []
    packages += request.pip_deps
    if packages:
        runtime_env["pip"] = {"packages": packages}
    return runtime_env


def describe(request: JobRequest, runtime_env: dict[str, Any], address: str) -> str:
    """A summary safe to print: environment variable names only, never values."""
    lines = [
        f"address:     {address}",
        f"entrypoint:  {request.entrypoint}",
        f"working dir: {request.working_dir}",
        f"env vars:    {', '.join(sorted(runtime_env.get('env_vars', {}))) or '-'}",
        f"resources:   {request.entrypoint_resources() or '-'}"
        f" cpus={request.entrypoint_num_cpus} memory={request.entrypoint_memory}",
        f"pip:         {len(runtime_env.get('pip', {}).get('packages', []))} pinned packages",
    ]
    return "\n".join(lines)


def submit(client, request: JobRequest, runtime_env: dict[str, Any]) -> str:
    """Submit the job; returns its submission id."""
    metadata = {WORKING_DIR_KEY: str(request.working_dir), "marin_launcher": "ray_run"}
    if request.cluster_name:
        metadata["marin_cluster"] = request.cluster_name
    return client.submit_job(
        entrypoint=request.entrypoint,
        submission_id=request.submission_id,
        runtime_env=runtime_env,
        metadata=metadata,
        entrypoint_num_cpus=request.entrypoint_num_cpus,
        entrypoint_memory=request.entrypoint_memory,
        entrypoint_resources=request.entrypoint_resources(),
    )


def new_submission_id() -> str:
    """A job id in Ray's own form (`raysubmit_` and 16 letters or digits), chosen here so that
    the launcher knows the job's id even when it is interrupted while submitting it."""
    return "raysubmit_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(16))


# How long an interrupted launcher keeps looking for a job whose submission it cut short: the
# request may have reached the job server, which then creates the job a moment later.
_LATE_SUBMIT_WAIT = 5.0


def _stop_submitted(client, job_id: str) -> bool:
    """Stop `job_id`, waiting up to `_LATE_SUBMIT_WAIT` for it to appear; False if it never did."""
    deadline = time.monotonic() + _LATE_SUBMIT_WAIT
    while True:
        try:
            client.stop_job(job_id)
            return True
        except RuntimeError as e:  # Ray's client: status code 404 for a job it does not know (yet)
            if "404" not in str(e):
                raise
            if time.monotonic() > deadline:
                return False
        time.sleep(0.25)


# How long an interrupted launcher waits for the job server to take its stop request. Ray's job
# client sets no timeout on its HTTP calls, so a server that accepts and never answers would hold
# the launcher (and a `zephyr --cluster` command waiting on it) forever. `MARIN_STOP_REQUEST_TIMEOUT`
# sets it (a test of the give-up need not wait the full 30 s).
STOP_REQUEST_TIMEOUT = float(os.environ.get("MARIN_STOP_REQUEST_TIMEOUT", "30"))


def _within(seconds: float, fn, *args):
    """`fn(*args)` in a daemon thread; its result, or None if it has not returned after `seconds`
    (it is left behind: the process is on its way out). Its exception is raised here."""
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = e

    thread = threading.Thread(target=call, name="ray_run-stop-job", daemon=True)
    thread.start()
    thread.join(seconds)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


@contextlib.contextmanager
def _stop_on_interrupt(client, job_id: str, enabled: bool) -> Iterator[None]:
    """With `enabled`, stop the job when the launcher gets Ctrl-C or SIGTERM, also while it is
    still being submitted (the job may exist although `submit` never returned)."""

    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term) if enabled else None
    try:
        yield
    except KeyboardInterrupt:
        if enabled:
            print(f"\nInterrupted: stopping job {job_id}", file=sys.stderr)
            stopped = _within(STOP_REQUEST_TIMEOUT, _stop_submitted, client, job_id)
            if stopped is None:
                print(f"Job {job_id}: the job server did not answer the stop request within {STOP_REQUEST_TIMEOUT:.0f}s; "
                      "the job may still be running (stop it with `marin cluster stop-job`)", file=sys.stderr)
            elif not stopped:
                print(f"Job {job_id} was not submitted", file=sys.stderr)
        else:
            print(f"\nDetached; job {job_id} keeps running if it was submitted (use --auto-stop to stop it)",
                  file=sys.stderr)
        raise
    finally:
        if enabled:
            signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m marin.run.ray_run",
        description="Submit a command as a Ray job on a Marin cluster, with token auth.",
        epilog=__doc__.split("Examples:", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cluster",
        help="Cluster name (see `marin cluster list-configs`; `local` for this machine) or config yaml. "
        "Default: $RAY_ADDRESS (a dashboard URL), else the running local cluster.",
    )
    parser.add_argument("--no_wait", "--no-wait", action="store_true", help="Submit and return without streaming logs.")
    parser.add_argument(
        "-e",
        "--env_vars",
        nargs="+",
        action="append",
        default=[],
        metavar="KEY [VALUE]",
        help="Environment variable for the job: KEY VALUE, KEY=VALUE, or KEY (copied from here). Repeatable.",
    )
    parser.add_argument("--extra", default="", help="Comma-separated optional-dependency groups to pin from uv.lock.")
    parser.add_argument("--pip_deps", "--pip-deps", default="", help="Comma-separated extra pip requirements.")
    parser.add_argument(
        "--tpu", help="Run the entrypoint on the head host of a TPU slice of this type (e.g. v4-8), or 'auto'."
    )
    parser.add_argument("--entrypoint-num-cpus", type=amount_argument, help="CPUs reserved for the entrypoint.")
    parser.add_argument("--entrypoint-memory", type=memory_argument, help="Memory reserved for the entrypoint (e.g. 4GB, 512MiB).")
    parser.add_argument("--submission-id", help="Job id to use (default: raysubmit_ and 16 random letters or digits).")
    parser.add_argument("--auto-stop", action="store_true", help="Stop the job if this launcher is interrupted.")
    parser.add_argument("--exclude", action="append", default=[], help="Extra gitignore-style exclude. Repeatable.")
    parser.add_argument("--working-dir", type=Path, default=None, help="Directory to ship (default: current dir).")
    parser.add_argument("--dry-run", action="store_true", help="Print what would be submitted (no values of env vars).")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="The command, after `--`.")
    return parser


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _auto_tpu(target) -> str:
    """The cluster's worker type; v4-8 for the local cluster (None: no --cluster, no RAY_ADDRESS)."""
    if target is None or target.is_local:
        return "v4-8"
    return target.spec.worker_tpu_type


@contextlib.contextmanager
def _client_for(cluster: str | None):
    """(client, address, target) for --cluster, else $RAY_ADDRESS, else the local cluster."""
    if cluster:
        target = resolve_target(cluster)
        with job_client(target) as (client, address):
            yield client, address, target
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        if not address.startswith(("http://", "https://")):
            raise ValueError(
                f"RAY_ADDRESS must be the dashboard URL (http://host:8265) for job submission; got {address!r}"
            )
        token = os.environ.get("RAY_AUTH_TOKEN")
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        if not token and path.is_file():
            token = read_token(path, "marin cluster --cluster NAME auth")
        yield connect(address, token), address, None
        return
    if local.load() is None:
        raise RuntimeError(
            "No cluster: pass --cluster NAME, set RAY_ADDRESS, or start one with "
            "`marin cluster --cluster local start-cluster`"
        )
    target = Target("local")
    with job_client(target) as (client, address):
        yield client, address, target


def _dry_run_address(target) -> str:
    """Where a job would go, said without contacting it."""
    if target is not None and not target.is_local:
        return f"the {target.name} cluster's dashboard (a `marin cluster dashboard` forward or an SSH tunnel)"
    if target is None and os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    return "(local cluster)"


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("No command given: put it after `--`, e.g. `-- python experiments/hello_world.py`")
    request = JobRequest(
        command=command,
        working_dir=(args.working_dir or Path.cwd()).resolve(),
        env_vars=parse_env_vars(args.env_vars),
        extras=_split(args.extra),
        pip_deps=_split(args.pip_deps),
        excludes=list(args.exclude),
        entrypoint_num_cpus=args.entrypoint_num_cpus,
        entrypoint_memory=args.entrypoint_memory,
        submission_id=args.submission_id,
    )
    if args.tpu and args.tpu != "auto":
        tpu_head_resource(args.tpu)  # validate before connecting
    if args.tpu == "auto" and not args.cluster and os.environ.get("RAY_ADDRESS"):
        # a dashboard URL names no cluster, so its worker type is unknown: v4-8 would be a guess
        raise ValueError(
            f"--tpu auto needs to know the cluster, and RAY_ADDRESS ({os.environ['RAY_ADDRESS']}) does not say "
            "which it is: pass --cluster NAME or an explicit --tpu TYPE"
        )
    runtime_env = build_runtime_env(request)
    if args.dry_run:  # contacts nothing: no token fetched, no tunnel opened, no job API called
        target = resolve_target(args.cluster) if args.cluster else None
        request.cluster_name = target.name if target else None
        request.tpu = _auto_tpu(target) if args.tpu == "auto" else args.tpu
        print(describe(request, runtime_env, _dry_run_address(target)))
        return 0
    with _client_for(args.cluster) as (client, address, target):
        request.cluster_name = target.name if target else None
        request.tpu = _auto_tpu(target) if args.tpu == "auto" else args.tpu
        request.submission_id = request.submission_id or new_submission_id()
        with _stop_on_interrupt(client, request.submission_id, args.auto_stop):
            job_id = submit(client, request, runtime_env)
            print(f"Submitted job {job_id} to {address}", file=sys.stderr)
            if args.no_wait:
                name = f"--cluster {target.name}" if target else ""
                print(job_id)
                hint = f"Logs: marin cluster {name} job-logs {job_id}; stop: marin cluster {name} stop-job {job_id}"
                print(hint, file=sys.stderr)
                return 0
            status = jobs.follow_logs(client, job_id)
        message = client.get_job_info(job_id).message if status != "SUCCEEDED" else None
    print(f"Job {job_id} {status}" + (f": {message}" if message else ""), file=sys.stderr)
    return 0 if status == "SUCCEEDED" else 1


def _scrub(text: str) -> str:
    """`text` without any token this launcher could have used."""
    return redact(text, *known_tokens())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError, RuntimeError, ConnectionError, TimeoutError) as e:
        print(f"ray_run: error: {_scrub(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
