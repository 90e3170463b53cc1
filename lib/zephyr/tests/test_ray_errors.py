"""Which Ray errors are lost tasks: every class in `ray.exceptions` against a table written
by hand, then the real errors a cheap fault gives (a worker that exits, a cancel, a user bug)."""

from __future__ import annotations

import os
import sys

import pytest
import ray.exceptions
from ray import cloudpickle

from zephyr import create_backend
from zephyr.backends import TaskLost
from zephyr.backends.ray_errors import is_lost

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this file

# The oracle: every ray.exceptions class -> lost (the cluster's fault) or not.
LOST = {
    "NodeDiedError", "LocalRayletDiedError", "WorkerCrashedError",
    "ObjectLostError", "OwnerDiedError", "ObjectReconstructionFailedError", "ObjectFetchTimedOutError",
    "ReferenceCountingAssertionError",
    "RayActorError", "ActorDiedError", "ActorUnavailableError",
    "OutOfDiskError", "ObjectStoreFullError", "RpcError",
}
NOT_LOST = {
    "OutOfMemoryError",  # the task's own memory use: it would be killed again
    "TaskCancelledError",  # cancelled on purpose
    "ObjectFreedError",  # freed on purpose
    "RayTaskError", "RayError", "RaySystemError", "RuntimeEnvSetupError", "TaskUnschedulableError",
    "ActorUnschedulableError", "TaskPlacementGroupRemoved", "ActorPlacementGroupRemoved", "GetTimeoutError",
    "AuthenticationError", "ActorAlreadyExistsError", "ActorHandleNotFoundError", "AsyncioActorExit",
    "CrossLanguageError", "ObjectRefStreamEndOfStreamError", "OufOfBandObjectRefSerializationException",
    "PendingCallsLimitExceeded", "PlasmaObjectNotAvailable", "RayCgraphCapacityExceeded", "RayChannelError",
    "RayChannelTimeoutError", "RayDirectTransportError", "StreamingGeneratorReplayInconsistentError",
    "UnserializableException", "UserCodeException",
}


def ray_error_classes() -> dict[str, type]:
    return {name: cls for name, cls in vars(ray.exceptions).items()
            if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__.startswith("ray")}


def instance(cls: type) -> BaseException:
    return cls.__new__(cls)  # isinstance is all the classification looks at


def task_error(cause: BaseException) -> BaseException:
    wrapper = instance(ray.exceptions.RayTaskError)
    wrapper.cause = cause
    return wrapper


def test_the_table_covers_every_ray_error():
    """A Ray upgrade that adds an error class fails here until someone decides what it means."""
    assert not LOST & NOT_LOST
    assert set(ray_error_classes()) == LOST | NOT_LOST


@pytest.mark.parametrize("name", sorted(LOST | NOT_LOST))
def test_each_ray_error_is_classified_as_the_table_says(name):
    error = instance(ray_error_classes()[name])
    expected = name in LOST
    assert is_lost(error) is expected
    assert is_lost(task_error(error)) is expected  # the direct cause of a task error
    assert not is_lost(task_error(task_error(error)))  # raised inside the user's code: its failure
    assert is_lost(error, max_depth=0) is expected and not is_lost(task_error(error), max_depth=0)


def test_plain_exceptions_are_not_lost():
    for error in (ValueError("bug"), KeyboardInterrupt(), task_error(ValueError("bug")), task_error(None)):
        assert not is_lost(error)


# ---- real errors from a real Ray --------------------------------------------------------------


def _exit_worker():
    os._exit(1)


def _sleep():
    import time

    time.sleep(600)


def _bug():
    raise ValueError("a bug")


def _raised(ray_, ref) -> BaseException:
    try:
        ray_.get(ref, timeout=120)
    except Exception as e:  # noqa: BLE001 - the error is what this returns
        return e
    raise AssertionError("ray.get returned")


class _Exiter:
    def exit(self):
        os._exit(1)


@pytest.mark.ray
def test_real_ray_errors(ray_shared):
    ray_ = ray_shared
    backend = create_backend("ray", progress=False)  # uses the Ray already started
    crash = ray_.remote(max_retries=0)(_exit_worker).remote()
    crashed = _raised(ray_, crash)
    assert isinstance(crashed, ray.exceptions.WorkerCrashedError) and is_lost(crashed)
    with pytest.raises(TaskLost, match="WorkerCrashedError"):
        backend.result(crash)

    actor = ray_.remote(max_restarts=0)(_Exiter).remote()
    died = _raised(ray_, actor.exit.remote())
    assert isinstance(died, ray.exceptions.RayActorError) and is_lost(died)

    buggy = _raised(ray_, ray_.remote(max_retries=0)(_bug).remote())
    assert isinstance(buggy, ray.exceptions.RayTaskError) and isinstance(buggy, ValueError) and not is_lost(buggy)

    sleeping = ray_.remote(max_retries=0)(_sleep).remote()
    ray_.cancel(sleeping, force=True)
    cancelled = _raised(ray_, sleeping)
    assert isinstance(cancelled, ray.exceptions.TaskCancelledError) and not is_lost(cancelled)
    # Regression: the Ray backend took a cancel for a loss, and the runner resubmitted the task
    with pytest.raises(ray.exceptions.TaskCancelledError):
        backend.result(sleeping)
