"""A model-based quality classifier: fastText, trained from labelled JSON Lines, scored on the workers.

    path = train_quality_classifier("labelled/*.jsonl", "models/quality.bin")   # {"text", "label"} records
    backend.put("quality-model", model_bytes(path))                            # shipped once, by name
    ds.flat_map(QualityClassifier("quality-model", threshold=0.5))             # adds quality_score

fastText models are native objects that cannot be pickled, so the backend shares the model's
bytes (`backend.put`, Ray's object store on Ray), and each worker process loads them once, on
first use, keyed by their digest: no closure carries the model. The binding is
`fasttext-numpy2` (full fastText: training and prediction; measured in benchmarks/README.md).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import fsspec

from zephyr import counters, get_shared
from zephyr.io import expand_glob, open_output, read_jsonl

__all__ = ["QualityClassifier", "load_model_bytes", "model_bytes", "train_quality_classifier"]

_loaded: dict[str, Any] = {}  # per process: model digest -> fastText model
_lock = threading.Lock()


def _clean(text: str) -> str:
    return " ".join(text.split())  # fastText reads one example per line


def train_quality_classifier(input_glob: str, output_path: str, *, text_field: str = "text", label_field: str = "label",
                             epoch: int = 25, lr: float = 0.5, word_ngrams: int = 2, dim: int = 64, bucket: int = 200_000,
                             seed: int = 0) -> str:
    """Train a fastText classifier on the records of `input_glob` (JSON Lines with a text and a
    label field) and write it to `output_path`; returns that path. Single-threaded, so the same
    data and seed give the same model."""
    import fasttext

    paths = expand_glob(input_glob)
    if not paths:
        raise FileNotFoundError(f"train_quality_classifier: no files match {input_glob!r}")
    records = [(r[label_field], r[text_field]) for path in paths for r in read_jsonl(path)]
    if len({label for label, _ in records}) < 2:
        raise ValueError(f"train_quality_classifier needs at least two labels in {input_glob!r}, got {sorted({l for l, _ in records})}")
    with tempfile.TemporaryDirectory() as tmp:
        train = os.path.join(tmp, "train.txt")
        with open(train, "w", encoding="utf-8") as f:
            f.writelines(f"__label__{label} {_clean(text)}\n" for label, text in records)
        model = fasttext.train_supervised(train, epoch=epoch, lr=lr, wordNgrams=word_ngrams, dim=dim, bucket=bucket, seed=seed,
                                          thread=1, verbose=0)
        local = os.path.join(tmp, "model.bin")
        model.save_model(local)
        with open(local, "rb") as f, open_output(output_path) as out:
            out.write(f.read())
    return output_path


def model_bytes(path: str) -> bytes:
    """A saved model's bytes, what `backend.put` shares."""
    with fsspec.open(path, "rb") as f:
        return f.read()


def load_model_bytes(data: bytes) -> Any:
    """The fastText model of these bytes, loaded once per process."""
    import fasttext

    digest = hashlib.sha256(data).hexdigest()
    with _lock:
        if digest not in _loaded:
            with tempfile.NamedTemporaryFile(suffix=".bin") as f:
                f.write(data)
                f.flush()
                _loaded[digest] = fasttext.load_model(f.name)
        return _loaded[digest]


@dataclass(frozen=True)
class QualityClassifier:
    """A `flat_map` step: scores a text record with the model shared under `model_name`, adds
    `quality_score` (the probability of `label`) and keeps records scoring at least
    `threshold` (drops counted under `web/classifier/dropped`)."""

    model_name: str
    threshold: float = 0.5
    label: str = "hq"

    def __call__(self, record: dict) -> list[dict]:
        model = load_model_bytes(get_shared(self.model_name))
        labels, scores = model.predict(_clean(record["text"]), k=-1)
        score = dict(zip(labels, map(float, scores))).get(f"__label__{self.label}", 0.0)
        if score < self.threshold:
            counters.increment("web/classifier/dropped")
            return []
        counters.increment("web/classifier/kept")
        return [{**record, "quality_score": round(min(score, 1.0), 4)}]
