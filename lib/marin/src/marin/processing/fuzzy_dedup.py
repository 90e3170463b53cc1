"""A Marin step that removes near duplicates from an executor input with zephyr's
`Dataset.deduplicate_fuzzy`; every parameter that decides the output is versioned, so
changing one gives the step a new output path. `cc_rounds` is not: it decides only whether
the connected components converge, never what a converged run writes, so a step that failed
with NotConvergedError reruns at the same path with a larger `cc_rounds` (and
`force_run_failed`). `cluster_field` and `kept_field` count only when not at their defaults,
so steps written before they existed keep their paths. An `input_path` given as a plain path
string counts by its text (the executor leaves plain values out of the hash, so another input
directory would find the first one's SUCCESS and skip); a step reference counts as a dependency.

    dedup = fuzzy_dedup_step("corpus/fuzzy_dedup", output_path_of(cleaned), threshold=0.8)
    executor_main([cleaned, dedup])

The pipeline reads `<input_path>/*.jsonl*`, writes `<output_path>/data-{shard:05d}.jsonl.zst`
with `skip_existing=True`, and reruns resume its finished shuffle stages.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from zephyr import Dataset, flow_backend

from marin.execution import ExecutorStep, this_output_path, versioned

__all__ = ["FuzzyDedupConfig", "fuzzy_dedup", "fuzzy_dedup_step"]


@dataclass(frozen=True)
class FuzzyDedupConfig:
    input_path: str
    output_path: str
    text_field: str = "text"
    threshold: float = 0.8
    ngram: int = 5
    num_perms: int | None = None
    bands: int | None = None
    seed: int = 0
    annotate: bool = False
    input_glob: str = "*.jsonl*"
    num_output_shards: int | None = None
    cluster_field: str = "fuzzy_cluster"
    kept_field: str = "fuzzy_kept"
    cc_rounds: int | None = None  # None: zephyr's default


_UNVERSIONED = frozenset({"cc_rounds"})  # never changes a converged run's output
_VERSIONED_UNLESS_DEFAULT = frozenset({"cluster_field", "kept_field"})  # added later: old paths stay


def _field(name: str, record: dict) -> str:
    return record[name]


def fuzzy_dedup(config: FuzzyDedupConfig) -> None:
    """Run near-duplicate removal over the input's JSONL shards (on `zephyr.flow_backend()`)."""
    pipeline = (
        Dataset.from_files(f"{config.input_path}/{config.input_glob}")
        .load_jsonl()
        .deduplicate_fuzzy(
            functools.partial(_field, config.text_field),
            threshold=config.threshold,
            ngram=config.ngram,
            num_perms=config.num_perms,
            bands=config.bands,
            seed=config.seed,
            annotate=config.annotate,
            cluster_field=config.cluster_field,
            kept_field=config.kept_field,
            cc_rounds=config.cc_rounds,
            num_output_shards=config.num_output_shards,
        )
        .write_jsonl(f"{config.output_path}/data-{{shard:05d}}.jsonl.zst", skip_existing=True)
    )
    list(flow_backend().execute(pipeline))


def fuzzy_dedup_step(name: str, input_path: Any, **params: Any) -> ExecutorStep:
    """An `ExecutorStep` running `fuzzy_dedup` over `input_path` (e.g. `output_path_of(step)`),
    with `params` (FuzzyDedupConfig fields) versioned as the module docstring says."""
    defaults = {k: f.default for k, f in FuzzyDedupConfig.__dataclass_fields__.items() if k not in ("input_path", "output_path")}
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise TypeError(f"fuzzy_dedup_step got unexpected parameters {unknown}; valid: {sorted(defaults)}")
    if isinstance(input_path, (str, os.PathLike)):  # a plain value would not count in the output path
        input_path = versioned(os.fspath(input_path))
    config = FuzzyDedupConfig(
        input_path=input_path,
        output_path=this_output_path(),
        **{k: _version(k, params.get(k, v), v) for k, v in defaults.items()},
    )
    return ExecutorStep(name=name, fn=fuzzy_dedup, config=config)


def _version(name: str, value: Any, default: Any) -> Any:
    if name in _UNVERSIONED or (name in _VERSIONED_UNLESS_DEFAULT and value == default):
        return value
    return versioned(value)
