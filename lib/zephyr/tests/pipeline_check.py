"""Running one generated pipeline on Zephyr and on the plain-Python oracle, and comparing.

A `Case` is input shards, a pipeline of steps (each knows its `Dataset` call and its oracle
call, see `test_pipeline_properties.Step`) and how to run it. `check` compares:
- where the oracle raises (a user error: a select of a non-dict, a default join of non-dicts),
  Zephyr must fail the shard with the same error type (a `ShardError` naming it), not crash;
- otherwise the shard count (when collected shard by shard), and the records: exactly, shard by
  shard, where the docs define placement, else as a bag.
Where an op's result depends on which shard holds what after a shuffle (which the docs leave
open), the oracle goes on from Zephyr's shards of the pipeline up to that shuffle, once they
hold the oracle's records in its number of shards (`expected_result`). Keep-first ops keep the
first in the pipeline's input, which the oracle tracks (`oracle.Model.in_input_order`) up to
the first placement it takes from Zephyr; a keep-first op after that is not checked (the case
is rejected, `InputOrderUnknown`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, event
from hypothesis.errors import InvalidArgument

from lib.zephyr.tests import oracle
from zephyr import Dataset, ShardError, create_backend

__all__ = ["Case", "check", "checkable_result", "collect_shard", "expected_result", "fresh_backend", "run_case", "skew_everywhere",
           "zephyr_placement", "zephyr_result"]


def collect_shard(items):
    return [list(items)]


@dataclasses.dataclass(frozen=True)
class Case:
    """Input shards, a pipeline, and how to run it: `skew` cuts any partition bigger than the
    median into key ranges (as a 64 MiB one would be); `by_shard` collects the output shard by
    shard (a map_shard: such a stage is never cut), else as one stream."""

    shards: list
    pipeline: list
    skew: bool = False
    by_shard: bool = True


def note(text: str) -> None:
    """`hypothesis.event`, for the statistics; nothing when called outside a generated example."""
    try:
        event(text)
    except InvalidArgument:
        pass


class ZephyrFailed(AssertionError):
    """Zephyr raised where the oracle did not: a test failure, never an expected error."""


class InputOrderUnknown(Exception):
    """A keep-first op where the oracle does not know the input order of its records (after ops
    whose outputs take the origin of the last item they read): such a case is not checked."""


def expected_result(case: Case, placed) -> tuple[oracle.Model, list[list[Any]]] | Exception:
    """The oracle's shards (materialized), or the error it raised. Before an op whose result
    depends on placement the docs leave open (after a shuffle), `placed(prefix, model)` gives
    Zephyr's shards of the pipeline up to that shuffle, checked against the oracle's bag, and the
    oracle goes on from them: so such ops are checked exactly after any shuffle."""
    model = oracle.from_shards(case.shards)
    models = [model]  # the model after each step
    try:
        for i, step in enumerate(case.pipeline):
            if step.needs_placement and not model.exact:
                cut = max(j for j in range(i) if case.pipeline[j].shuffles) + 1
                model = oracle.from_shards(placed(case.pipeline[:cut], models[cut]))
                model.in_input_order = False  # Zephyr's shards: which record came first is not known here
                for between in case.pipeline[cut:i]:  # per-item ops: placement stays
                    model = between.on_model(model)
            if step.needs_input_order and not model.in_input_order:
                raise InputOrderUnknown(f"{step} after {case.pipeline[:i]}")
            model = step.on_model(model)
            models.append(model)
        return model, model.materialize()
    except (AssertionError, InputOrderUnknown):
        raise
    except Exception as e:  # the oracle's own errors: a select of a non-dict, a default join of non-dicts
        return e


def zephyr_result(backend, case: Case, pipeline=None, by_shard: bool = True) -> list:
    """Zephyr's output shards (`by_shard`), or its items in shard order."""
    ds = Dataset.from_list(case.shards).flat_map(list)  # shard i holds case.shards[i]
    for step in case.pipeline if pipeline is None else pipeline:
        ds = step.on_dataset(ds)
    ds = ds.map_shard(collect_shard) if by_shard else ds
    execution = backend.execute(ds)
    out = list(execution)
    planned = [stage.num_shards for stage in ds.plan().stages]
    if any(stats.num_shards > planned[stats.index] for stats in execution.stats):
        note("a partition was cut into key ranges")
    return out


def zephyr_placement(backend, case: Case):
    """`placed` for `expected_result`: Zephyr's shards of a pipeline prefix ending in a shuffle,
    which must hold the oracle's bag in the oracle's number of shards."""

    def placed(prefix: list, model: oracle.Model) -> list[list[Any]]:
        try:
            got = zephyr_result(backend, case, prefix)
        except Exception as e:
            raise ZephyrFailed(f"Zephyr failed on {prefix} where the oracle did not: {e}") from e
        want = model.materialize()
        assert len(got) == len(want), f"shard count after {prefix}"
        assert oracle.bag(r for shard in got for r in shard) == oracle.bag(r for shard in want for r in shard), f"records after {prefix}"
        note("placement taken from Zephyr after a shuffle")
        return got

    return placed


def checkable_result(backend, case: Case) -> tuple[oracle.Model, list[list[Any]]] | Exception:
    """`expected_result` with Zephyr's placement; a case the oracle cannot model is rejected
    (hypothesis draws another)."""
    try:
        return expected_result(case, zephyr_placement(backend, case))
    except InputOrderUnknown:
        event("not checked: a keep-first op after a placement taken from Zephyr")  # seen in --hypothesis-show-statistics
        assume(False)
        raise


def check(backend, case: Case) -> None:
    expected = checkable_result(backend, case)
    for step in case.pipeline:  # `--hypothesis-show-statistics` shows what the examples covered
        note(f"op: {step.name}")
    note(f"oracle: {type(expected).__name__ if isinstance(expected, Exception) else 'result'}")
    if isinstance(expected, Exception):  # a user error: Zephyr fails the shard with the same error, not a crash of its own
        with pytest.raises(ShardError) as failed:
            zephyr_result(backend, case, by_shard=case.by_shard)
        assert failed.value.error_type == type(expected).__name__, f"the oracle raised {expected!r}; Zephyr: {failed.value}"
        return
    model, want = expected
    got = zephyr_result(backend, case, by_shard=case.by_shard)
    if case.by_shard:
        assert len(got) == len(want), "shard count"
        got_records = [r for shard in got for r in shard]
    else:
        got_records = got
    want_records = [r for shard in want for r in shard]
    if model.exact:
        if case.by_shard:
            assert [[oracle.canon(r) for r in shard] for shard in got] == [[oracle.canon(r) for r in shard] for shard in want]
        assert [oracle.canon(r) for r in got_records] == [oracle.canon(r) for r in want_records]
    else:
        assert oracle.bag(got_records) == oracle.bag(want_records)


@contextlib.contextmanager
def skew_everywhere(on: bool) -> Iterator[None]:
    """Cut any partition bigger than the median into key ranges, as a skewed one of 64 MiB is:
    the threshold and factor off, and runs indexing every row as a batch (so tiny partitions
    have key-range boundaries). The driver decides the cuts; the batch size reaches only
    in-process tasks (Ray's workers keep 1 MiB batches, so Ray examples are rarely cut)."""
    if not on:
        yield
        return
    from zephyr.shuffle import run_index, runs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEPHYR_SKEW_MIN_BYTES", "0")
        patch.setattr(run_index, "SKEW_FACTOR", 1.0)
        patch.setattr(runs, "BATCH_BYTES", 1)
        patch.setattr(runs, "FRAME_TARGET", 1)
        yield


def run_case(kind: str, case: Case) -> None:
    with skew_everywhere(case.skew), fresh_backend(kind) as backend:
        check(backend, case)


@contextlib.contextmanager
def fresh_backend(kind: str):
    """A backend with its own scratch directory: no example resumes another's scratch."""
    with tempfile.TemporaryDirectory(prefix="zephyr-oracle-") as scratch:
        backend = create_backend(kind, max_parallelism=4, progress=False, scratch_dir=scratch)
        try:
            yield backend
        finally:
            backend.close()
