"""Language identification on real pages: the package a page came from is the oracle (a
translation's page left mostly in English counts as English, told by comparing its paragraphs
with the English original: `expected_language`), and the model needs no network."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter

import pytest

from lib.marin.tests.web_pages import doc_pages
from marin.web.debian_docs import expected_language
from marin.web.extract import HtmlExtractor
from marin.web.langid import LanguageFilter, LanguageIdentifier, identify_language
from marin.web.sample_warc import page_record
from zephyr import Dataset, create_backend


@pytest.mark.slow
def test_accuracy_per_language_on_pages_whose_language_is_clear():
    extract = HtmlExtractor()
    right, total, unclear = Counter(), Counter(), 0
    for page in doc_pages():
        label = expected_language(page)
        if label is None:
            unclear += 1
            continue
        language, _ = identify_language(extract(page_record(page))[0]["text"])
        total[label] += 1
        right[label] += language == label
    print("\naccuracy per language:", {k: f"{right[k]}/{total[k]}" for k in sorted(total)}, f"({unclear} half-translated pages left out)")
    assert set(total) == {"de", "en", "es", "fr", "id", "it", "ja", "pt", "zh"}
    assert sum(right.values()) / sum(total.values()) >= 0.98
    assert all(right[k] / total[k] >= 0.9 for k in total), (right, total)
    assert total["en"] > 300 and unclear < 60


def test_untranslated_pages_of_a_translation_are_labelled_english():
    pages = doc_pages()
    relabelled = [p for p in pages if p.package_language != "en" and expected_language(p) == "en"]
    assert relabelled, "the Debian Reference translations leave some pages in English"
    for page in relabelled:
        text = HtmlExtractor()(page_record(page))[0]["text"]
        assert identify_language(text)[0] == "en", page.path


def test_the_step_adds_language_and_keeps_only_the_asked_languages():
    step = LanguageIdentifier(languages=("de",))
    german = {"text": "Dies ist ein ganz gewöhnlicher deutscher Satz über das Wetter in Berlin."}
    [kept] = step(german)
    assert kept["language"] == "de" and 0.5 < kept["language_score"] <= 1.0
    assert step({"text": "This is an ordinary English sentence about the weather in London."}) == []
    assert LanguageIdentifier(min_score=0.999)({"text": "ok"}) == []
    with pytest.raises(ValueError, match="min_score must be within"):
        LanguageIdentifier(min_score=2)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a process without network")
def test_the_model_loads_and_runs_without_a_network():
    code = ("import urllib.request\n"
            "try:\n    urllib.request.urlopen('https://pypi.org', timeout=5); raise SystemExit('network reachable')\n"
            "except OSError: pass\n"
            "from marin.web.langid import identify_language\n"
            "print(identify_language('Ceci est une phrase tout à fait ordinaire sur le temps qu il fait.')[0])\n")
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("unshare --net is not permitted here (needs root)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fr"


def test_a_later_step_filters_on_the_language_an_earlier_one_labelled():
    labelled = [LanguageIdentifier()({"text": t})[0] for t in (
        "Dies ist ein ganz gewöhnlicher deutscher Satz über das Wetter in Berlin.",
        "This is an ordinary English sentence about the weather in London.",
        "12345")]
    backend = create_backend("sync", progress=False)
    execution = backend.execute(Dataset.from_list(labelled).flat_map(LanguageFilter(languages=("en", "de"), min_score=0.5)))
    kept = list(execution)
    assert [r["language"] for r in kept] == ["de", "en"] and kept == labelled[:2]
    assert execution.counters["web/language/low_score"] == 1  # "12345": no language to tell
    execution = backend.execute(Dataset.from_list(labelled[:2]).flat_map(LanguageFilter(languages=["en"])))
    assert [r["language"] for r in execution] == ["en"] and execution.counters["web/language/dropped/de"] == 1
    with pytest.raises(ValueError, match="min_score must be within"):
        LanguageFilter(min_score=-0.1)
