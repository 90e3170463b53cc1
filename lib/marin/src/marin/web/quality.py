"""Quality heuristics as one pipeline step, with a counter per rule.

`QualityFilter` runs the published rules in the order FineWeb's pipeline runs them (Gopher
repetition, Gopher quality, C4, FineWeb; `marin.web.rules`), drops a document at the first rule
it breaks and counts the drop under `web/quality/drop/<rule>`; `web/quality/kept` counts what
passes. C4 also removes lines from documents it keeps (lines without terminal punctuation,
"javascript", policy boilerplate), as published: each removed line is counted under
`web/quality/c4_lines_removed/<reason>`, and `c4=None` leaves text untouched.

    Dataset.from_files(...).load_warc().flat_map(HtmlExtractor()).flat_map(LanguageIdentifier(("en",))) \\
        .flat_map(QualityFilter())
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marin.web.rules import C4Rules, FineWebRules, GopherQualityRules, GopherRepetitionRules, split_words
from zephyr import counters

__all__ = ["QualityFilter", "first_broken_rule"]


@dataclass(frozen=True)
class QualityFilter:
    """A `flat_map` step over text records: `[record]` (its text after C4's line removal) when
    every rule passes, else `[]`, counted by rule. A rule set set to None is not applied."""

    gopher_repetition: GopherRepetitionRules | None = field(default_factory=GopherRepetitionRules)
    gopher_quality: GopherQualityRules | None = field(default_factory=GopherQualityRules)
    c4: C4Rules | None = field(default_factory=C4Rules)
    fineweb: FineWebRules | None = field(default_factory=FineWebRules)

    def __call__(self, record: dict) -> list[dict]:
        rule, text = first_broken_rule(record["text"], self)
        if rule is not None:
            counters.increment(f"web/quality/drop/{rule}")
            return []
        counters.increment("web/quality/kept")
        return [record if text == record["text"] else {**record, "text": text}]


def first_broken_rule(text: str, rules: QualityFilter) -> tuple[str | None, str]:
    """(the first rule `text` breaks or None, the text as C4 leaves it)."""
    if not text.strip():
        return "empty", text
    repetition = rules.gopher_repetition
    if repetition is not None and (rule := repetition.by_lines(text)):
        return rule, text  # before splitting words: what a huge repeated page costs stays small
    words = split_words(text)
    if not words:
        return "no_words", text
    if repetition is not None and (rule := repetition.by_n_grams(text, words)):
        return rule, text
    if rules.gopher_quality is not None and (rule := rules.gopher_quality(text, words)):
        return rule, text
    if rules.c4 is not None:
        rule, text, removed = rules.c4(text)
        for reason, lines in removed.items():
            counters.increment(f"web/quality/c4_lines_removed/{reason}", lines)
        if rule:
            return rule, text
        words = split_words(text)
    if rules.fineweb is not None and (rule := rules.fineweb(text, words)):
        return rule, text
    return None, text
