"""Run a function on every host of one or more TPU slices, surviving preemption.

``run_on_tpu(fn, "v4-16")`` does, per attempt:

1. Reserve each slice: one small actor per slice asks for the slice's head resource
   (``TPU-v4-16-head``), so it lands on host 0 of a free slice and holds the slice for the
   attempt. It reports its node, IP and slice name (the ``ray.io/tpu-slice-name`` node
   label that Ray sets on TPU VMs, or ``$TPU_NAME``).
2. Fan out: the actor starts one task per host. A single-host slice runs on the actor's own
   node. For a multi-host slice the driver makes a ``STRICT_SPREAD`` placement group of one
   ``{TPU: chips, <slice name>: 1}`` bundle per host (only that slice's hosts carry the
   slice-name resource), and task ``i`` runs in bundle ``i``: exactly once per host. Each
   task sets the multislice variables (``MEGASCALE_*``) when ``num_slices > 1``, runs
   ``fn()``, and removes the libtpu lockfile however ``fn`` ends. When the run spans more
   than one host, every host first joins one multi-host JAX program
   (``jax.distributed.initialize``; on TPU VMs process ids follow the TPU worker numbers,
   elsewhere the bundle order): the host that becomes JAX process 0 picks a port,
   publishes ``ip:port`` through a small rendezvous actor, and the others read it there;
   each host leaves the program (``jax.distributed.shutdown``) when ``fn`` returns (a
   failed host's process just exits: the others are cancelled).
3. Collect: as soon as any host fails, the other hosts' tasks are cancelled; the slice
   actors and placement groups are released after every attempt.

Between attempts the driver classifies the failure. A lost node, worker or actor of the
run itself (Ray's ``NodeDiedError``, ``WorkerCrashedError``, ``ActorDiedError``,
``OwnerDiedError``, ``ObjectLostError``, ... raised for a slice actor or a host task; the
list is ``zephyr.backends.ray_errors``, shared with Zephyr's Ray backend) is a preemption:
it is retried up to ``max_retries_preemption`` times without touching the failure budget.
The same errors raised *by* ``fn`` (its own actors or objects were lost) are failures, like
any other exception from ``fn``; so are Ray's out-of-memory kill and a cancelled task.
Anything raised by ``fn`` is a failure: it is retried up to ``max_retries_failure`` times
and then re-raised, as the exception type ``fn`` raised and with the remote traceback in
its message.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from zephyr.backends.ray_errors import lost_error_types

from marin.tpu import distributed
from marin.tpu.distributed import INIT_TIMEOUT_S, DistributedConfig
from marin.tpu.errors import TpuPreemptedError, TpuSetupError, is_preemption
from marin.tpu.lockfile import remove_tpu_lockfile_on_exit
from marin.logs import show_marin_lines
from marin.tpu.slices import HOST_ID_ENV, NUM_HOSTS_ENV, SLICE_ID_ENV, TPU_RESOURCE, TpuSlice, parse_tpu_type

__all__ = [
    "PREEMPTION_ERRORS",
    "SLICE_NAME_LABEL",
    "SLICE_WAIT_WARNING_INTERVAL",
    "TpuPreemptedError",
    "TpuSetupError",
    "is_preemption",
    "run_on_tpu",
]

logger = logging.getLogger(__name__)

# While no slice of the requested type is free, a warning this often (seconds): on an
# autoscaling cluster a wait is normal, a silent wait of hours is not.
SLICE_WAIT_WARNING_INTERVAL = 300.0

PREEMPTION_ERRORS: tuple[type[BaseException], ...] = lost_error_types()
"""Ray errors that mean a host went away (preemption), not that the user's code failed: the
one list, `zephyr.backends.ray_errors` (Zephyr's Ray backend retries the same errors)."""

SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
MEGASCALE_PORT = 8081



def _cause_chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None


def _user_error(error: BaseException) -> BaseException:
    """The innermost task error: the one whose message holds ``fn``'s own traceback."""
    innermost = error
    for e in _cause_chain(error):
        if isinstance(e, RayTaskError):
            innermost = e
    return innermost


def run_on_tpu(
    fn: Callable[[], Any],
    tpu_type: str,
    *,
    num_slices: int = 1,
    max_retries_preemption: int = 100,
    max_retries_failure: int = 3,
    num_cpus: float = 1,
    runtime_env: dict | None = None,
    fresh_process: bool = True,
    jax_distributed: bool = True,
) -> list[Any]:
    """Run ``fn()`` once on every host of ``num_slices`` slices of ``tpu_type``; retry on loss.

    Blocks until every host finished. Call it from a Ray driver (or from an
    ``ExecutorStep`` function, which runs in one); ``fn`` must be picklable.

    Args:
        fn: the work for one host. It takes no arguments; inside it, ``MARIN_TPU_HOST_ID``,
            ``MARIN_TPU_NUM_HOSTS`` and ``MARIN_TPU_SLICE_ID`` say where it runs and, when
            ``num_slices > 1``, ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_PORT``,
            ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID`` are set for libtpu.
        tpu_type: the accelerator type of each slice, e.g. ``"v4-8"``, ``"v5litepod-16"``.
        num_slices: how many slices to run on at once (multislice training).
        max_retries_preemption: how many times a lost host restarts the whole run.
        max_retries_failure: how many times an exception from ``fn`` restarts the run
            before it is re-raised.
        num_cpus: CPUs each host task asks for, besides all of the host's chips.
        runtime_env: Ray runtime environment for the host tasks (e.g. ``env_vars``).
        fresh_process: run each host's ``fn`` in a worker process that exits afterwards, so
            libtpu releases the chips for the next attempt. Keep it on real TPUs. Runs that
            join multi-host JAX always use fresh processes.
        jax_distributed: when the run spans more than one host (a multi-host slice, or
            several slices), join all hosts into one JAX program before ``fn`` runs, so
            ``jax.devices()`` lists every chip of the run; process ids follow slice then host.

    Returns:
        ``fn``'s return values, ordered by slice then host.

    Raises:
        ValueError: bad ``tpu_type`` or counts.
        TpuPreemptedError: hosts were lost more than ``max_retries_preemption`` times.
        Exception: what ``fn`` raised, after ``max_retries_failure`` retries; its message
            carries the remote traceback.
    """
    spec = parse_tpu_type(tpu_type)
    _check_count("num_slices", num_slices, minimum=1)
    _check_count("max_retries_preemption", max_retries_preemption, minimum=0)
    _check_count("max_retries_failure", max_retries_failure, minimum=0)
    launch = _Launch(spec, num_slices, num_cpus, runtime_env or {}, fresh_process,
                     jax_distributed and spec.num_hosts * num_slices > 1)
    budget = _RetryBudget(tpu_type, num_slices, max_retries_preemption, max_retries_failure)
    while True:
        try:
            return _attempt(fn, launch)
        except TpuSetupError:
            raise
        except Exception as error:  # noqa: BLE001 - classified, then retried or re-raised
            budget.charge(error)


@dataclass
class _RetryBudget:
    """Counts the losses (preemptions) and failures of a run; raises when either runs out."""

    tpu_type: str
    num_slices: int
    max_preemptions: int
    max_failures: int
    preemptions: int = 0
    failures: int = 0

    def charge(self, error: BaseException) -> None:
        """Count ``error`` against its budget: return to retry, or raise when it is spent.

        Raises:
            TpuPreemptedError: a host was lost more than ``max_preemptions`` times.
            Exception: ``fn``'s own error (the innermost task error, with a note), after
                more than ``max_failures`` failures.
        """
        if is_preemption(error):
            self.preemptions += 1
            if self.preemptions > self.max_preemptions:
                raise TpuPreemptedError(
                    f"{self.tpu_type} x{self.num_slices}: lost a host {self.preemptions} times, more than "
                    f"max_retries_preemption={self.max_preemptions}; last error: {error}"
                ) from error
            logger.warning("%s: host lost (preemption %d/%d), restarting: %s",
                           self.tpu_type, self.preemptions, self.max_preemptions, _first_line(error))
            return
        self.failures += 1
        user_error = _user_error(error)
        if self.failures > self.max_failures:
            user_error.add_note(
                f"run_on_tpu({self.tpu_type!r}): fn failed {self.failures} times "
                f"(max_retries_failure={self.max_failures}); {self.preemptions} preemptions"
            )
            raise user_error from None
        logger.warning("%s: fn failed (failure %d/%d), retrying: %s",
                       self.tpu_type, self.failures, self.max_failures, _first_line(user_error))


def _check_count(name: str, value: int, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


@dataclass(frozen=True)
class _Launch:
    spec: TpuSlice
    num_slices: int
    num_cpus: float
    runtime_env: dict
    fresh_process: bool
    jax_distributed: bool  # join the hosts into one multi-host JAX program

    @property
    def num_processes(self) -> int:
        return self.spec.num_hosts * self.num_slices


@dataclass(frozen=True)
class _SliceInfo:
    node_id: str
    ip: str
    slice_name: str | None


def _attempt(fn: Callable[[], Any], launch: _Launch) -> list[Any]:
    holder_cls = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(_SliceHolder)
    holders = [
        holder_cls.options(resources={launch.spec.head_resource: 1}).remote()
        for _ in range(launch.num_slices)
    ]
    groups: list[PlacementGroup | None] = []
    rendezvous = None
    if launch.jax_distributed:  # on the driver's node, not on a preemptible TPU host
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        rendezvous = ray.remote(num_cpus=0, max_restarts=0)(_Rendezvous).options(scheduling_strategy=here).remote()
    try:
        infos: list[_SliceInfo] = _get_waiting([h.info.remote() for h in holders], launch,
                                               f"a free host with the {launch.spec.head_resource!r} resource per slice")
        # The driver owns the placement groups, so they go away with the attempt even when
        # a slice actor dies with its host.
        for info in infos:
            groups.append(_host_group(launch, info))
        _get_waiting([group.ready() for group in groups if group is not None], launch,
                     f"all {launch.spec.num_hosts} hosts of each slice")
        coordinator_ip = infos[0].ip
        refs = [
            holder.run.remote(fn, launch, _slice_env(launch.num_slices, slice_id, coordinator_ip), group, rendezvous)
            for slice_id, (holder, group) in enumerate(zip(holders, groups, strict=True))
        ]
        # Slice actors are killed below, which stops their hosts' tasks; no cancel needed.
        return [result for per_slice in _gather(refs, cancel_rest=False) for result in per_slice]
    finally:
        for actor in [*holders, *([rendezvous] if rendezvous is not None else [])]:
            ray.kill(actor, no_restart=True)
        for group in groups:
            if group is not None:
                remove_placement_group(group)


def _get_waiting(refs: list, launch: _Launch, what: str) -> list:
    """`ray.get(refs)`, with a warning every SLICE_WAIT_WARNING_INTERVAL seconds while some
    are not ready, naming `what` the run waits for."""
    started = time.monotonic()
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=SLICE_WAIT_WARNING_INTERVAL)
        if pending:
            logger.warning("%s x%d: waited %.0f s for %s (%d of %d not ready); the autoscaler must provide them "
                           "(see `ray status`)", launch.spec.tpu_type, launch.num_slices, time.monotonic() - started,
                           what, len(pending), len(refs))
    return ray.get(list(refs))


def _host_group(launch: _Launch, info: _SliceInfo) -> PlacementGroup | None:
    """For a multi-host slice: one bundle per host of the slice that ``info`` describes.

    ``STRICT_SPREAD`` puts the bundles on different nodes and the slice-name resource keeps
    them on this slice, so each host runs ``fn`` exactly once, even if one host finishes
    before another's task is scheduled.
    """
    spec = launch.spec
    if not spec.is_multi_host:
        return None
    if info.slice_name is None:
        raise TpuSetupError(
            f"host 0 of a {spec.tpu_type} slice (node {info.node_id}) has no slice name: expected the node "
            f"label {SLICE_NAME_LABEL!r} or $TPU_NAME, naming a resource that every host of the slice carries"
        )
    bundle = {TPU_RESOURCE: spec.chips_per_host, info.slice_name: 1}
    if launch.num_cpus:
        bundle["CPU"] = launch.num_cpus
    return placement_group([dict(bundle) for _ in range(spec.num_hosts)], strategy="STRICT_SPREAD")


def _slice_env(num_slices: int, slice_id: int, coordinator_ip: str) -> dict[str, str]:
    env = {SLICE_ID_ENV: str(slice_id)}
    if num_slices > 1:
        env.update({
            "MEGASCALE_COORDINATOR_ADDRESS": coordinator_ip,
            "MEGASCALE_PORT": str(MEGASCALE_PORT),
            "MEGASCALE_NUM_SLICES": str(num_slices),
            "MEGASCALE_SLICE_ID": str(slice_id),
        })
    return env


def _gather(refs: Sequence[ray.ObjectRef], *, cancel_rest: bool = True) -> list[Any]:
    """``ray.get`` all refs in order, but on the first failure cancel the rest and raise it."""
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done[0])  # raises on failure
    except BaseException:
        for ref in pending if cancel_rest else ():
            try:
                ray.cancel(ref, force=True)
            except Exception as e:  # noqa: BLE001 - best effort; the first failure matters
                logger.debug("could not cancel %s: %s", ref, e)
        raise
    return ray.get(list(refs))


class _SliceHolder:
    """Holds one slice (through its head resource) for one attempt and fans out to its hosts."""

    def info(self) -> _SliceInfo:
        node_id = ray.get_runtime_context().get_node_id()
        return _SliceInfo(node_id, ray.util.get_node_ip_address(), _current_slice_name(node_id))

    def run(self, fn: Callable[[], Any], launch: _Launch, env: dict[str, str], group: PlacementGroup | None,
            rendezvous: Any = None):
        spec = launch.spec
        # max_calls=1: the worker process exits after fn, so libtpu lets go of the chips (and
        # a multi-host JAX program can only be joined by a process that has not used JAX).
        fresh = launch.fresh_process or launch.jax_distributed
        task = ray.remote(max_calls=1 if fresh else 0)(_run_on_host)
        options: dict[str, Any] = {
            "num_cpus": launch.num_cpus,
            "resources": {TPU_RESOURCE: spec.chips_per_host},
            "max_retries": 0,
            "runtime_env": launch.runtime_env or None,
        }
        envs = [{**env, HOST_ID_ENV: str(host), NUM_HOSTS_ENV: str(spec.num_hosts)} for host in range(spec.num_hosts)]
        if group is None:  # single host: this node
            node_id = ray.get_runtime_context().get_node_id()
            strategies = [NodeAffinitySchedulingStrategy(node_id, soft=False)]
        else:
            strategies = [
                PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=host)
                for host in range(spec.num_hosts)
            ]
        slice_id = int(env[SLICE_ID_ENV])
        joins = [
            DistributedConfig("", launch.num_processes, slice_id * spec.num_hosts + host) if launch.jax_distributed
            else None
            for host in range(spec.num_hosts)
        ]
        refs = [
            task.options(**options, scheduling_strategy=strategy).remote(fn, host_env, join, rendezvous)
            for strategy, host_env, join in zip(strategies, envs, joins, strict=True)
        ]
        return _gather(refs)


class _Rendezvous:
    """Hands JAX process 0's coordinator address to the other hosts of one attempt."""

    def __init__(self):
        self._address: str | None = None
        self._published: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._published is None:  # created on the actor's event loop
            self._published = asyncio.Event()
        return self._published

    async def publish(self, address: str) -> None:
        self._address = address
        self._event().set()

    async def address(self) -> str:
        await self._event().wait()
        assert self._address is not None
        return self._address


def _join_jax(join: DistributedConfig, rendezvous: Any) -> None:
    """Join the multi-host JAX program: process 0 picks the coordinator address, others wait for it."""
    process_id = _process_id(join.process_id)
    if process_id == 0:
        address = f"{ray.util.get_node_ip_address()}:{distributed.free_port()}"
        ray.get(rendezvous.publish.remote(address))
    else:
        address = ray.get(rendezvous.address.remote(), timeout=INIT_TIMEOUT_S)
    distributed.initialize(DistributedConfig(address, join.num_processes, process_id))


def _process_id(bundle_process_id: int) -> int:
    """This host's JAX process id: on a TPU VM it must follow the TPU runtime's worker number
    (which host of the slice's topology this is), so ``slice * hosts + worker``; elsewhere
    (simulated hosts, GPUs) the placement-group bundle's order."""
    worker = _tpu_worker_id()
    if worker is None:
        return bundle_process_id
    return int(os.environ[SLICE_ID_ENV]) * int(os.environ[NUM_HOSTS_ENV]) + worker


def _tpu_worker_id() -> int | None:
    """GKE's ``TPU_WORKER_ID``, else (only on a host with TPU chips) the GCE metadata's worker number."""
    if os.environ.get("TPU_WORKER_ID"):
        return int(os.environ["TPU_WORKER_ID"])
    if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return None
    from ray._private.accelerators import TPUAcceleratorManager

    return TPUAcceleratorManager.get_current_node_tpu_worker_id()


def _show_marin_logs() -> None:
    """Let INFO lines of ``marin.*`` (training metrics) reach the worker's stderr, which Ray
    forwards to the driver, unless the process already configured logging."""
    if not logging.getLogger().handlers:
        show_marin_lines()


def _current_slice_name(node_id: str) -> str | None:
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            name = (node.get("Labels") or {}).get(SLICE_NAME_LABEL)
            if name and name in (node.get("Resources") or {}):
                return name
    name = os.environ.get("TPU_NAME")
    return name or None


def _run_on_host(fn: Callable[[], Any], env: dict[str, str], join: DistributedConfig | None = None,
                 rendezvous: Any = None) -> Any:
    _show_marin_logs()
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    started = time.monotonic()
    try:
        with remove_tpu_lockfile_on_exit():
            if join is None:
                return fn()
            _join_jax(join, rendezvous)
            result = fn()
            # Leave together after success. After a failure, skip the shutdown barrier (it
            # would wait for hosts that are still busy): the driver cancels them, and this
            # fresh process exits, which ends its membership.
            distributed.shutdown()
            return result
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        logger.info("host %s of slice %s finished in %.1fs", env.get(HOST_ID_ENV), env.get(SLICE_ID_ENV),
                    time.monotonic() - started)
