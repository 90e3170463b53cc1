"""`marin cluster ...`: start, stop, restart, inspect and authenticate to Marin clusters.

Every command takes the cluster as `--cluster NAME` (`local` is a Ray head on this machine)
or `--config infra/marin-NAME.yaml`. Commands that would run `ray up/down`, `gcloud` or `ssh`
accept `--dry-run` and then print those command lines instead of running them; job commands
under `--dry-run` contact nothing (`submit-job` runs ray_run's own dry run).

Examples:
    marin cluster --cluster local start-cluster
    marin cluster --cluster local submit-job -- python experiments/hello_world.py
    marin cluster --config infra/marin-us-central2.yaml restart-cluster --no-preserve-jobs
    marin cluster --cluster us-east5 --dry-run add-worker v6e-8 --capacity reserved
    eval "$(marin cluster --cluster us-central2 auth-env)"
    marin cluster update-configs
    marin cluster --dry-run build-image --region us-central2
    marin cluster --cluster us-central2 clean-preempted-tpus
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from marin.cluster import config, jobs, local, maintenance, registry
from marin.cluster.auth import auth_env_lines, redact
from marin.cluster.commands import (
    DASHBOARD_PORT,
    format_command,
    gcloud_create_tpu,
    gcloud_tpu_ssh,
    ray_down,
    ray_get_head_ip,
    ray_up,
    require_tools,
    run_command,
    ssh_tunnel,
    worker_join_script,
)
from marin.cluster.config import Capacity
from marin.cluster.target import (
    Target,
    clear_forward,
    fetch_token,
    job_client,
    known_tokens,
    record_forward,
    resolve_target,
)
from marin.run import ray_run

__all__ = ["build_parser", "main"]

HEAD_IP = "<head-ip>"  # stands for the head's address in --dry-run output


def _print(*lines: str) -> None:
    for line in lines:
        print(line)


# --- lifecycle -------------------------------------------------------------------------------


def cmd_start(target: Target, args: argparse.Namespace) -> int:
    if target.is_local:
        cluster = local.start(num_cpus=args.num_cpus, dry_run=args.dry_run)
        if cluster is not None:
            print(f"Local cluster running: dashboard {cluster.dashboard_url}")
            _print(*auth_env_lines(cluster.token_path, cluster.dashboard_url))
        return 0
    run_command(ray_up(target.config), dry_run=args.dry_run)
    return 0


def cmd_stop(target: Target, args: argparse.Namespace) -> int:
    if target.is_local:
        stopped = local.stop(dry_run=args.dry_run)
        if not args.dry_run:
            print("Local cluster stopped." if stopped else "Local cluster was not running.")
        return 0
    run_command(ray_down(target.config), dry_run=args.dry_run)
    return 0


def _backup_path(target: Target) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = local.state_dir() if target.is_local else Path.home() / ".marin" / "job-backups"
    return base / f"jobs-{target.name}-{stamp}-{uuid.uuid4().hex[:6]}.json"


def _restore_when_ready(target: Target, records: list[dict], timeout: float) -> int:
    """Resubmit recorded jobs once the restarted head answers; returns the exit status."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with job_client(target) as (client, _):
                resubmitted, skipped = jobs.restore(client, records)
            break
        except (ConnectionError, RuntimeError, TimeoutError) as e:  # a head still starting may not answer in time
            if time.monotonic() > deadline:
                print(f"Could not resubmit jobs: {e}", file=sys.stderr)
                return 1
            time.sleep(10)
    for job_id in resubmitted:
        print(f"Resubmitted {job_id}")
    for line in skipped:
        print(f"Not resubmitted: {line}", file=sys.stderr)
    return 0 if not skipped else 1


def cmd_restart(target: Target, args: argparse.Namespace) -> int:
    if args.dry_run:
        if args.preserve_jobs:
            print("# record pending/running jobs through the job API, then:")
        cmd_stop(target, args)
        cmd_start(target, args)
        if args.preserve_jobs:
            print("# resubmit the recorded jobs through the job API")
        return 0
    records: list[dict] = []
    if args.preserve_jobs:
        with job_client(target) as (client, _):
            records = jobs.snapshot(client)
        path = jobs.save_snapshot(records, _backup_path(target))
        print(f"Recorded {len(records)} running job(s) in {path}")
    cmd_stop(target, args)
    cmd_start(target, args)
    if not records:
        return 0
    return _restore_when_ready(target, records, timeout=60 if target.is_local else 900)


# --- access ----------------------------------------------------------------------------------


def _head_ip(target: Target) -> str:
    return run_command(ray_get_head_ip(target.config), dry_run=False, capture=True).stdout.strip().splitlines()[-1]


def cmd_dashboard(target: Target, args: argparse.Namespace) -> int:
    if target.is_local:
        cluster = local.load()
        if cluster is None:
            raise RuntimeError("The local cluster is not running; start it with `start-cluster`")
        print(f"Dashboard: {cluster.dashboard_url}  (token in {cluster.token_path})")
        return 0
    port = args.port
    if args.dry_run:
        print(f"# {HEAD_IP}: the output of `{format_command(ray_get_head_ip(target.config))}`")
        print(format_command(ssh_tunnel(HEAD_IP, {port: DASHBOARD_PORT})))
        return 0
    head_ip = _head_ip(target)
    require_tools("ssh", purpose="Forwarding the dashboard")
    print(f"Dashboard: http://localhost:{port}  (token in {target.token_path}; Ctrl-C to close the tunnel)")
    proc = subprocess.Popen(ssh_tunnel(head_ip, {port: DASHBOARD_PORT}))
    # Job commands reuse this port only while this record names the cluster and ssh lives.
    record_forward(target.name, port, proc.pid)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
        return 0
    finally:
        clear_forward(port, proc.pid)


def cmd_auth(target: Target, args: argparse.Namespace) -> int:
    if target.is_local:
        path = target.token_path
        if not path.is_file():
            raise RuntimeError("The local cluster has no token yet; `start-cluster` makes one")
        cluster = local.load()
        where = cluster.dashboard_url if cluster else "(not running)"
        print(f"Token: {path}\nDashboard: {where}\nUse the token file's contents when the dashboard asks for it.")
        return 0
    path = fetch_token(target, args.dry_run)
    if not args.dry_run:
        print(f"Installed the {target.name} token in {path} (never printed).")
        print(f"Dashboard: run `marin cluster --cluster {target.name} dashboard`, paste the token from {path}.")
    return 0


def cmd_auth_env(target: Target, args: argparse.Namespace) -> int:
    address = None
    if target.is_local and (cluster := local.load()) is not None:
        address = cluster.dashboard_url
    _print(*auth_env_lines(target.token_path, address))
    return 0


# --- jobs ------------------------------------------------------------------------------------


def _dry_job(target: Target, args: argparse.Namespace, action: str) -> bool:
    """Under --dry-run a job command contacts nothing (no token fetched, no tunnel, no job API
    call): it says what it would do and the caller returns. True when it did."""
    if args.dry_run:
        print(f"# dry run: would {action} through the job API of the {target.name} cluster; nothing contacted")
    return args.dry_run


def cmd_list_jobs(target: Target, args: argparse.Namespace) -> int:
    if _dry_job(target, args, "list its jobs"):
        return 0
    with job_client(target) as (client, _):
        print(jobs.format_jobs(client.list_jobs()))
    return 0


def cmd_submit_job(target: Target, args: argparse.Namespace) -> int:
    dry = ["--dry-run"] if args.dry_run else []  # `marin cluster --dry-run submit-job ...` submits nothing
    # a --config copy (hand-edited, or outside infra/) is passed on as itself: its name alone
    # would resolve to infra/'s config of that name, or to none
    cluster = str(target.config_file) if target.config_file else target.name
    return ray_run.main(["--cluster", cluster, *dry, *args.ray_run_args])


def cmd_job_logs(target: Target, args: argparse.Namespace) -> int:
    if _dry_job(target, args, f"print the logs of job {args.job_id}"):
        return 0
    with job_client(target) as (client, _):
        if args.follow:
            jobs.follow_logs(client, args.job_id)
        else:
            sys.stdout.write(client.get_job_logs(args.job_id))
    return 0


def cmd_stop_job(target: Target, args: argparse.Namespace) -> int:
    if _dry_job(target, args, f"stop job {args.job_id}"):
        return 0
    with job_client(target) as (client, _):
        stopped = client.stop_job(args.job_id)
        status = jobs.wait_for(client, args.job_id, timeout=args.timeout, poll=0.5) if stopped else "not running"
    print(f"Job {args.job_id}: {status}")
    return 0


def cmd_wait_job(target: Target, args: argparse.Namespace) -> int:
    if _dry_job(target, args, f"wait for job {args.job_id}"):
        return 0
    with job_client(target) as (client, _):
        status = jobs.wait_for(client, args.job_id, timeout=args.timeout)
    print(f"Job {args.job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


# --- workers and configs ---------------------------------------------------------------------


def cmd_add_worker(target: Target, args: argparse.Namespace) -> int:
    capacity = Capacity(args.capacity)
    if target.is_local:
        node = local.add_worker(args.tpu_type, dry_run=args.dry_run)
        if node is not None:
            print(f"Added a local {args.tpu_type} worker (pid {node.pid}, resources {node.resources})")
        return 0
    spec = target.spec
    name = args.name or f"ray-worker-{spec.name}-{args.tpu_type}-{uuid.uuid4().hex[:6]}"
    run_command(gcloud_create_tpu(spec, name, args.tpu_type, capacity), dry_run=args.dry_run)
    if args.dry_run:
        print(f"# {HEAD_IP}: the output of `{format_command(ray_get_head_ip(target.config))}`")
        head_ip = HEAD_IP
    else:
        head_ip = _head_ip(target)
    run_command(gcloud_tpu_ssh(spec, name, worker_join_script(spec, head_ip)), dry_run=args.dry_run)
    return 0


def cmd_update_configs(target: Target | None, args: argparse.Namespace) -> int:
    if args.check:
        stale = config.check_configs() + registry.check_policy_file()
        if stale:
            print(f"Out of date: {', '.join(stale)}; run `marin cluster update-configs`", file=sys.stderr)
            return 1
        print("All generated configs match the template.")
        return 0
    for path in [*config.write_configs(), registry.write_policy_file()]:
        print(f"Wrote {path}")
    return 0


def cmd_list_configs(target: Target | None, args: argparse.Namespace) -> int:
    print(f"{'NAME':<13} {'ZONE':<16} {'WORKERS':<12} {'CAPACITY':<12} {'BUCKET':<26} CONFIG")
    print(f"{'local':<13} {'this machine':<16} {'v4-8 (sim)':<12} {'-':<12} {'-':<26} -")
    for spec in config.CLUSTERS.values():
        print(
            f"{spec.name:<13} {spec.zone:<16} {spec.worker_tpu_type:<12} {spec.capacity.value:<12} "
            f"{spec.bucket:<26} infra/{spec.config_file}"
        )
    return 0


def _flag_value(text: str) -> bool:
    """`1/0`, `true/false`, `yes/no` (`--preserve-jobs=0`, as the infra guide writes it)."""
    value = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected 1/0, true/false or yes/no, got {text!r}")
    return value


_NO_TARGET = {"update-configs", "list-configs", *maintenance.NO_TARGET}

AddCommand = Callable[[str, Callable, str], argparse.ArgumentParser]
"""`add(name, func, help)`: a subcommand of `marin cluster` that runs `func(target, args)`."""


def build_parser(prog: str = "marin cluster") -> argparse.ArgumentParser:
    dry_help = "Print the external commands instead of running them."
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS, help=dry_help)
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Manage Marin Ray clusters and their jobs (token auth throughout).",
        epilog=__doc__.split("Examples:", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cluster",
        default=os.environ.get("MARIN_CLUSTER"),
        help="Cluster name (`local`, us-central2, ...) or config yaml. Default: $MARIN_CLUSTER.",
    )
    parser.add_argument("--config", help="Generated cluster config, e.g. infra/marin-us-central2.yaml.")
    parser.add_argument("--dry-run", action="store_true", default=False, help=dry_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[dry], help=help, description=help)
        p.set_defaults(func=func)
        return p

    for register in (_add_cluster_commands, _add_job_commands, _add_worker_and_auth_commands, _add_config_commands,
                     maintenance.register):
        register(add)
    return parser


def _add_cluster_commands(add: AddCommand) -> None:
    """start-cluster, stop-cluster, restart-cluster, dashboard."""
    cpus_help = "CPUs of the local head (default $MARIN_LOCAL_NUM_CPUS or 2)."
    p = add("start-cluster", cmd_start, "Start the cluster (`ray up`, or a local head).")
    p.add_argument("--num-cpus", type=int, default=None, help=cpus_help)
    add("stop-cluster", cmd_stop, "Stop the cluster (`ray down`, or the local head's processes).")
    p = add("restart-cluster", cmd_restart, "Stop and start the cluster, resubmitting running jobs.")
    p.add_argument(
        "--preserve-jobs",
        nargs="?",
        const=True,
        default=True,
        type=_flag_value,
        metavar="1|0",
        help="Record running jobs and resubmit them after the restart (default: on; `--preserve-jobs=0` is off).",
    )
    p.add_argument("--no-preserve-jobs", dest="preserve_jobs", action="store_false", help="Same as --preserve-jobs=0.")
    p.add_argument("--num-cpus", type=int, default=None, help=cpus_help)
    p = add("dashboard", cmd_dashboard, "Port-forward the dashboard and print its URL.")
    p.add_argument("--port", type=int, default=DASHBOARD_PORT, help="Local port for the dashboard (default 8265).")


def _add_job_commands(add: AddCommand) -> None:
    """list-jobs, submit-job, job-logs, stop-job, wait-job."""
    add("list-jobs", cmd_list_jobs, "List submitted jobs, newest first.")
    p = add("submit-job", cmd_submit_job, "Submit a job: `python -m marin.run.ray_run` options, then -- COMMAND.")
    p.add_argument("ray_run_args", nargs=argparse.REMAINDER, help="ray_run options and the command after --.")
    p = add("job-logs", cmd_job_logs, "Print a job's logs.")
    p.add_argument("job_id", help="Submission id, e.g. raysubmit_...")
    p.add_argument("-f", "--follow", action="store_true", help="Stream until the job finishes.")
    p = add("stop-job", cmd_stop_job, "Stop a job and wait until it has stopped.")
    p.add_argument("job_id", help="Submission id.")
    p.add_argument("--timeout", type=float, default=60, help="Seconds to wait for it to stop.")
    p = add("wait-job", cmd_wait_job, "Wait for a job to finish; exit 0 only if it succeeded.")
    p.add_argument("job_id", help="Submission id.")
    p.add_argument("--timeout", type=float, default=None, help="Give up after this many seconds.")


def _add_worker_and_auth_commands(add: AddCommand) -> None:
    """add-worker, auth, auth-env."""
    p = add("add-worker", cmd_add_worker, "Add a TPU worker by hand (reserved capacity cannot autoscale).")
    p.add_argument("tpu_type", metavar="TPU_TYPE", help="Accelerator type, e.g. v4-8, v6e-8.")
    p.add_argument(
        "--capacity",
        choices=[c.value for c in Capacity],
        default=Capacity.PREEMPTIBLE.value,
        help="How the VM is bought.",
    )
    p.add_argument("--name", help="TPU VM name (default: generated).")
    add("auth", cmd_auth, "Fetch and install the cluster's token (never printed); say how to open the dashboard.")
    add("auth-env", cmd_auth_env, 'Print `export` lines for Ray\'s CLI/SDK: eval "$(marin cluster ... auth-env)".')


def _add_config_commands(add: AddCommand) -> None:
    """update-configs, list-configs."""
    p = add(
        "update-configs",
        cmd_update_configs,
        "Regenerate infra/marin-<name>.yaml from the template (and the registry cleanup policy file).",
    )
    p.add_argument("--check", action="store_true", help="Only check that the committed files are up to date.")
    add("list-configs", cmd_list_configs, "List the clusters and their configs.")


def main(argv: Sequence[str] | None = None, prog: str = "marin cluster") -> int:
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `submit-job` belongs to ray_run (argparse would take its options as ours).
    ray_run_args = None
    if "submit-job" in argv:
        cut = argv.index("submit-job") + 1
        argv, ray_run_args = argv[:cut], argv[cut:]
    args = parser.parse_args(argv)
    if ray_run_args is not None:
        args.ray_run_args = ray_run_args
    target = None
    try:
        if args.command not in _NO_TARGET:
            target = resolve_target(args.cluster, args.config)
        return args.func(target, args)
    except (ValueError, FileNotFoundError, RuntimeError, ConnectionError, TimeoutError) as e:
        print(f"{prog}: error: {redact(str(e), *known_tokens())}", file=sys.stderr)
        return 2
