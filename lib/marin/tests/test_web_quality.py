"""Quality heuristics: each rule drops what it names (and is counted), the decisions agree with
datatrove's implementations page by page, and non-prose pages (terminal screens, indexes) go."""

from __future__ import annotations

import re
from collections import Counter

import lxml.html
import pytest

from lib.marin.tests.web_pages import doc_pages
from marin.web import rules as R
from marin.web.extract import HtmlExtractor
from marin.web.langid import identify_language
from marin.web.quality import QualityFilter, first_broken_rule
from marin.web.sample_warc import page_record
from zephyr import Dataset, create_backend

@pytest.fixture(scope="module")
def english_texts():
    extract = HtmlExtractor()
    texts = [(p, extract(page_record(p))[0]["text"]) for p in doc_pages()]
    return [(p, t) for p, t in texts if identify_language(t)[0] == "en"]


@pytest.fixture(scope="module")
def prose(english_texts) -> str:
    """A real English page that passes every rule (its lines as C4 leaves them)."""
    return next(QualityFilter()({"text": t})[0]["text"] for _, t in english_texts if QualityFilter()({"text": t}))


def _defect(prose: str, kind: str) -> str:
    words = prose.split()
    return {
        "gopher_short_doc": " ".join(words[-45:]),
        "gopher_too_many_bullets": "\n".join("- " + line for line in prose.splitlines()),
        "gopher_too_many_hashes": prose + "\n" + "".join(f" #t{i}" for i in range(len(words) // 4)),
        "gopher_dup_para_frac": prose + "\n\n" + prose,
        "c4_lorem_ipsum": prose + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.",
        "c4_curly_bracket": prose + "\nThe value of {x} is set here by the caller.",
    }[kind]


@pytest.mark.parametrize("rule", ["gopher_short_doc", "gopher_too_many_bullets", "gopher_too_many_hashes", "gopher_dup_para_frac",
                                  "c4_lorem_ipsum", "c4_curly_bracket"])
def test_each_rule_drops_what_it_names_and_counts_it(prose, rule):
    text = _defect(prose, rule)
    assert first_broken_rule(prose, QualityFilter())[0] is None
    assert first_broken_rule(text, QualityFilter())[0] == rule
    execution = create_backend("sync", progress=False).execute(Dataset.from_list([{"text": text}]).flat_map(QualityFilter()))
    assert list(execution) == [] and execution.counters[f"web/quality/drop/{rule}"] == 1


def test_c4_removes_only_counted_lines(prose):
    text = "Menu Home About\n" + prose + "\nThis site uses cookies to improve the experience for you."
    execution = create_backend("sync", progress=False).execute(Dataset.from_list([{"text": text}]).flat_map(QualityFilter()))
    [kept] = list(execution)
    assert kept["text"] == prose  # the menu line and the cookie line removed, nothing else
    c = execution.counters
    assert (c["web/quality/kept"], c["web/quality/c4_lines_removed/no_terminal_punct"], c["web/quality/c4_lines_removed/policy"]) == (1, 1, 1)


@pytest.mark.slow
def test_decisions_agree_with_datatrove_per_rule(english_texts):
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    pairs = {"gopher_repetition": (GopherRepetitionFilter(), R.GopherRepetitionRules()),
             "gopher_quality": (GopherQualityFilter(), R.GopherQualityRules()),
             "c4": (C4QualityFilter(), R.C4Rules()), "fineweb": (FineWebQualityFilter(), R.FineWebRules())}
    texts = [text for _, text in english_texts[::2]]  # every other page: datatrove's rules take most of the time
    agreement, dropped = {}, Counter()
    for name, (theirs, ours) in pairs.items():
        same = 0
        for text in texts:
            keeps = theirs.filter(Document(text=text, id="x")) is True
            rule = ours(text)[0] if name == "c4" else ours(text, R.split_words(text))
            same += keeps == (rule is None)
            dropped[name] += not keeps
        agreement[name] = same / len(texts)
    print(f"\nagreement with datatrove on {len(texts)} English pages:", agreement, "datatrove drops:", dict(dropped))
    assert all(dropped[name] > 0 for name in pairs), dropped  # every rule set had pages to drop: agreement is not trivial
    assert all(share >= 0.98 for share in agreement.values()), agreement


def test_the_splitter_splits_as_spacy_does():
    assert R.split_words("Don't stop: it's (nearly) done... e.g. U.S. well-known a/b os.path.join() $5.") == [
        "Do", "n't", "stop", ":", "it", "'s", "(", "nearly", ")", "done", "...", "e.g", ".", "U.S", ".", "well", "-", "known",
        "a", "/", "b", "os.path.join", "(", ")", "$", "5", "."]


def _screens(page) -> str:
    """The terminal sessions a Debian Reference page shows (its pre.screen blocks), as one text."""
    tree = lxml.html.fromstring(page.read())
    return "\n".join(pre.text_content() for pre in tree.xpath("//pre[@class='screen']"))


def test_terminal_screens_and_index_pages_are_dropped(english_texts):
    screens = [_screens(p) for p in doc_pages() if p.package == "debian-reference-en"]
    screens = [s for s in screens if len(s.split()) >= 50]
    assert len(screens) >= 8
    rules = Counter(first_broken_rule(s, QualityFilter())[0] for s in screens)
    assert None not in rules, rules
    indexes = [t for p, t in english_texts if re.search(r"/genindex", p.url)]
    assert indexes and all(first_broken_rule(t, QualityFilter())[0] is not None for t in indexes)


def test_a_huge_repeated_page_is_dropped_before_its_words_are_split(monkeypatch):
    """Regression: every page was split into words before any rule ran, so the 20 MB page of
    one repeated paragraph (sample_warc.bad_pages) cost 20 CPU s in the quality step."""
    import marin.web.quality as quality

    def no_split(text):
        raise AssertionError(f"split_words called on {len(text):,} characters")

    monkeypatch.setattr(quality, "split_words", no_split)
    text = "\n\n".join(["All work and no play makes a long page. " * 25] * 20_000)  # 20 MB
    assert first_broken_rule(text, QualityFilter())[0] == "gopher_dup_para_frac"
