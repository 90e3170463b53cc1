"""The fastText quality classifier: trained from labelled JSONL, shipped once to the workers by
name (backend.put), scores kept as a field, documents below the threshold dropped and counted."""

from __future__ import annotations

import orjson
import pytest

from lib.marin.tests.web_pages import doc_pages
from marin.web.classifier import QualityClassifier, model_bytes, train_quality_classifier
from marin.web.extract import HtmlExtractor
from marin.web.sample_warc import page_record
from zephyr import Dataset, create_backend


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Python manual pages labelled hq, C++ reference pages lq: two real kinds of text, split by hash."""
    extract = HtmlExtractor()
    pages = [p for p in doc_pages() if p.package in ("python3.11-doc", "cppreference-doc-en-html")]
    records = [{"text": extract(page_record(p))[0]["text"], "label": "hq" if p.package == "python3.11-doc" else "lq"} for p in pages]
    train, held = records[::2], records[1::2]
    path = tmp_path_factory.mktemp("labelled") / "train.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in train))
    return str(path), held


def test_trained_model_is_shipped_once_and_scores_held_out_pages(labelled, tmp_path):
    train, held = labelled
    model = train_quality_classifier(train, str(tmp_path / "quality.bin"))
    backend = create_backend("threadpool", max_parallelism=2, progress=False)
    backend.put("quality-model", model_bytes(model))
    execution = backend.execute(Dataset.from_list([held[i::4] for i in range(4)]).flat_map(lambda shard: shard).flat_map(QualityClassifier("quality-model", threshold=0.5)))
    kept = list(execution)
    right = sum(r["label"] == "hq" for r in kept) + sum(r["label"] == "lq" for r in held) - sum(r["label"] == "lq" for r in kept)
    assert right / len(held) >= 0.9, (right, len(held))  # held-out pages told apart
    assert all(0.5 <= r["quality_score"] <= 1.0 for r in kept)
    assert execution.counters["web/classifier/kept"] + execution.counters["web/classifier/dropped"] == len(held)
    again = train_quality_classifier(train, str(tmp_path / "again.bin"))
    assert model_bytes(again) == model_bytes(model)  # same data and seed, same model


def test_a_step_without_the_shared_model_names_what_to_put():
    backend = create_backend("sync", progress=False)
    with pytest.raises(Exception, match="no shared object named 'missing'"):
        list(backend.execute(Dataset.from_list([{"text": "x"}]).flat_map(QualityClassifier("missing"))))


def test_one_label_is_refused(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_bytes(b'{"text": "a b c", "label": "hq"}\n')
    with pytest.raises(ValueError, match="at least two labels"):
        train_quality_classifier(str(path), str(tmp_path / "m.bin"))
