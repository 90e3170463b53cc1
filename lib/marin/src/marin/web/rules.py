"""The published quality heuristics for web text, as plain functions: Gopher quality, Gopher
repetition (Rae et al. 2021, table A1), C4 (Raffel et al. 2020) and FineWeb (Penedo et al.
2024), with their published thresholds as defaults. Each returns the name of the first rule a
text breaks, or None; `marin.web.quality.QualityFilter` runs them as a step and counts.

The thresholds and the order of the checks are those of datatrove's implementations, which
the tests and benchmarks compare with, document by document. Words are split as spaCy's blank
English tokenizer (datatrove's word splitter for English) splits prose, at a fraction of its
cost; agreement per rule is measured (benchmarks/README.md section 16).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import regex

__all__ = ["C4Rules", "FineWebRules", "GopherQualityRules", "GopherRepetitionRules", "split_words"]

# spaCy's English punctuation classes, as its tokenizer peels them off each whitespace-split chunk
_PUNCT = "…,:;!?¿¡()[]{}<>_#*&。？！，、；：～·"
_QUOTES = "'\"”“`‘´’‚„»«「」『』（）〔〕【】《》〈〉"
_PREFIX = frozenset(_PUNCT + _QUOTES + "$£€¥§%=—–+")
_SUFFIX = frozenset(_PUNCT + _QUOTES + "—–.%")
_INFIX = regex.compile(r"((?<=\p{L})(?:--|-|–|—|~)(?=\p{L})|(?<=[\p{L}\p{N}])[:<>=/](?=\p{L})|(?<=\p{Ll})\.(?=\p{Lu})|(?<=\p{L}),(?=\p{L}))")
_CLITICS = ("'s", "'re", "'ve", "'ll", "'d", "'m", "’s", "’re", "’ve", "’ll", "’d", "’m")
# the characters datatrove counts as punctuation, symbols and control characters (its PUNCTUATION)
_SYMBOLS = frozenset(
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + "".join(chr(x) for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))
)
_TERMINAL = regex.compile(r"\p{Sentence_Terminal}$")
_SENTENCE_END = regex.compile(r"(?:\p{Sentence_Terminal}+[\"'”’)\]]*)(?:\s+|$)")
STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])
_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")
_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


def split_words(text: str) -> list[str]:
    """The words and punctuation marks of `text`, split as spaCy's blank English tokenizer
    splits prose: by whitespace, then punctuation peeled off each end one mark at a time (an
    ellipsis whole), clitics (n't, 's) apart, hyphens and slashes between letters apart."""
    out: list[str] = []
    for chunk in text.split():
        start, end = 0, len(chunk)
        while start < end and chunk[start] in _PREFIX:
            out.append(chunk[start])
            start += 1
        suffix = []
        while end > start and chunk[end - 1] in _SUFFIX:
            step = 3 if chunk.endswith("...", start, end) else 1
            suffix.append(chunk[end - step:end])
            end -= step
        core = chunk[start:end]
        if core:
            out.extend(_split_core(core))
        out.extend(reversed(suffix))
    return out


def _split_core(core: str) -> list[str]:
    lower = core.lower()
    if len(core) > 3 and lower.endswith(("n't", "n’t")):
        return [core[:-3], core[-3:]]
    for clitic in _CLITICS:
        if lower.endswith(clitic) and len(core) > len(clitic):
            return [core[:-len(clitic)], core[-len(clitic):]]
    if not _INFIX.search(core):
        return [core]
    return [piece for piece in _INFIX.split(core) if piece]


def _symbolic(word: str) -> bool:
    return all(ch in _SYMBOLS for ch in word)


@dataclass(frozen=True)
class GopherQualityRules:
    """Gopher's quality rules: word count, mean word length, symbol ratios, bullet and ellipsis
    lines, words with letters, stop words."""

    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3
    max_avg_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2

    def __call__(self, text: str, words: list[str]) -> str | None:
        plain = [w for w in words if not _symbolic(w)]
        if len(plain) < self.min_doc_words:
            return "gopher_short_doc"
        if len(plain) > self.max_doc_words:
            return "gopher_long_doc"
        mean = sum(map(len, plain)) / len(plain)
        if mean < self.min_avg_word_length:
            return "gopher_below_avg_word_length"
        if mean > self.max_avg_word_length:
            return "gopher_above_avg_word_length"
        if text.count("#") / len(words) > self.max_symbol_word_ratio:
            return "gopher_too_many_hashes"
        if (text.count("...") + text.count("…")) / len(words) > self.max_symbol_word_ratio:
            return "gopher_too_many_ellipsis"
        lines = text.splitlines() or [""]
        if sum(s.lstrip().startswith(("•", "-")) for s in lines) / len(lines) > self.max_bullet_lines_ratio:
            return "gopher_too_many_bullets"
        if sum(s.rstrip().endswith(("...", "…")) for s in lines) / len(lines) > self.max_ellipsis_lines_ratio:
            return "gopher_too_many_end_ellipsis"
        if sum(any(c.isalpha() for c in w) for w in words) / len(words) < self.min_alpha_words_ratio:
            return "gopher_below_alpha_threshold"
        if len(STOP_WORDS.intersection(words)) < self.min_stop_words:
            return "gopher_enough_stop_words"
        return None


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(how many items repeat an earlier one, their characters)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def _top_ngram_chars(words: list[str], n: int) -> int:
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def _repeated_ngram_chars(words: list[str], n: int) -> int:
    """Characters of the word n-grams that repeat an earlier one, jumping past each repeat."""
    seen: set[str] = set()
    chars = i = 0
    while i < len(words) - n + 1:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


@dataclass(frozen=True)
class GopherRepetitionRules:
    """Gopher's repetition rules: duplicate paragraphs and lines, top n-grams, repeated n-grams."""

    dup_para_frac: float = 0.3
    dup_para_char_frac: float = 0.2
    dup_line_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16))
    dup_n_grams: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))

    def __call__(self, text: str, words: list[str]) -> str | None:
        return self.by_lines(text) or self.by_n_grams(text, words)

    def by_lines(self, text: str) -> str | None:
        """The paragraph and line rules, which need no words: a page of one paragraph repeated
        (a 20 MB page) is dropped here before anything splits it into words."""
        for pieces, frac, char_frac, name in ((_PARAGRAPHS.split(text.strip()), self.dup_para_frac, self.dup_para_char_frac, "para"),
                                              (_LINES.split(text), self.dup_line_frac, self.dup_line_char_frac, "line")):
            count, chars = _duplicates(pieces)
            if count / len(pieces) > frac:
                return f"gopher_dup_{name}_frac"
            if chars / len(text) > char_frac:
                return f"gopher_dup_{name}_char_frac"
        return None

    def by_n_grams(self, text: str, words: list[str]) -> str | None:
        """The top and repeated word n-gram rules."""
        for n, frac in self.top_n_grams:
            if _top_ngram_chars(words, n) / len(text) > frac:
                return f"gopher_top_{n}_gram"
        for n, frac in self.dup_n_grams:
            if _repeated_ngram_chars(words, n) / len(text) > frac:
                return f"gopher_duplicated_{n}_n_grams"
        return None


@dataclass(frozen=True)
class C4Rules:
    """C4's rules: keep only lines that end in terminal punctuation, have 3+ words, no word over
    1000 characters, no "javascript", no policy boilerplate; drop a page with "lorem ipsum", a
    curly bracket, or fewer than 5 sentences left. Returns (rule or None, the kept text, how
    many lines each line rule removed)."""

    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000

    def __call__(self, text: str) -> tuple[str | None, str, Counter]:
        removed: Counter = Counter()
        kept, sentences = [], 0
        for line in text.splitlines():
            line = line.strip()
            words = line.split()
            if any(len(w) > self.max_word_length for w in words):
                removed["too_long_word"] += 1
                continue
            line = _CITATION.sub("", line)
            if not line.endswith((".", "?", "!", '"', "'")) or line.endswith("..."):
                removed["no_terminal_punct"] += 1
                continue
            if len(words) < self.min_words_per_line:
                removed["too_few_words"] += 1
                continue
            lower = line.lower()
            if "lorem ipsum" in lower:
                return "c4_lorem_ipsum", text, removed
            if "javascript" in lower:
                removed["javascript"] += 1
                continue
            if "{" in line:
                return "c4_curly_bracket", text, removed
            if any(p in lower for p in _POLICY):
                removed["policy"] += 1
                continue
            sentences += max(1, len(_SENTENCE_END.findall(line)))
            kept.append(line)
        if sentences < self.min_num_sentences:
            return "c4_too_few_sentences", text, removed
        return None, "\n".join(kept).strip(), removed


@dataclass(frozen=True)
class FineWebRules:
    """FineWeb's rules: lines ending in terminal punctuation, short lines, duplicate-line
    characters, newlines per word."""

    line_punct_thr: float = 0.12
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    new_line_ratio: float = 0.3

    def __call__(self, text: str, words: list[str]) -> str | None:
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return "fineweb_empty"
        if sum(bool(_TERMINAL.search(line)) for line in lines) / len(lines) < self.line_punct_thr:
            return "fineweb_line_punct_ratio"
        if sum(len(line) <= self.short_line_length for line in lines) / len(lines) > self.short_line_thr:
            return "fineweb_short_line_ratio"
        if _duplicates(lines)[1] / max(len(text.replace("\n", "")), 1) > self.char_duplicates_ratio:
            return "fineweb_char_dup_ratio"
        if text.count("\n") / max(len(words), 1) > self.new_line_ratio:
            return "fineweb_list_ratio"
        return None
