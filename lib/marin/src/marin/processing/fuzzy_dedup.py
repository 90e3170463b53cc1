"""A Marin step that removes near duplicates from an executor input with zephyr's
`Dataset.deduplicate_fuzzy`; every parameter that decides the output is versioned, so
changing one gives the step a new output path.

    dedup = fuzzy_dedup_step("corpus/fuzzy_dedup", output_path_of(cleaned), threshold=0.8)
    executor_main([cleaned, dedup])

The pipeline reads `<input_path>/*.jsonl*`, writes `<output_path>/data-{shard:05d}.jsonl.zst`
with `skip_existing=True`, and reruns resume its finished shuffle stages.
"""

from __future__ import annotations

import functools
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
            num_output_shards=config.num_output_shards,
        )
        .write_jsonl(f"{config.output_path}/data-{{shard:05d}}.jsonl.zst", skip_existing=True)
    )
    list(flow_backend().execute(pipeline))


def fuzzy_dedup_step(name: str, input_path: Any, **params: Any) -> ExecutorStep:
    """An `ExecutorStep` running `fuzzy_dedup` over `input_path` (e.g. `output_path_of(step)`),
    with each of `params` (FuzzyDedupConfig fields) versioned."""
    defaults = {k: f.default for k, f in FuzzyDedupConfig.__dataclass_fields__.items() if k not in ("input_path", "output_path")}
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise TypeError(f"fuzzy_dedup_step got unexpected parameters {unknown}; valid: {sorted(defaults)}")
    config = FuzzyDedupConfig(
        input_path=input_path,
        output_path=this_output_path(),
        **{k: versioned(params.get(k, v)) for k, v in defaults.items()},
    )
    return ExecutorStep(name=name, fn=fuzzy_dedup, config=config)
