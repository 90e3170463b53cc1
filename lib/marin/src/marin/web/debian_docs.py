"""Real web pages nobody here wrote: Debian's documentation packages, as a labelled page set.

Debian ships its manuals as HTML: the Debian Reference in 11 languages (`debian-reference-*`),
the Python 3.11 documentation (`python3.11-doc`) and cppreference (`cppreference-doc-en-html`).
They are real pages with real boilerplate (navigation bars, tables of contents, footers), code,
tables and 9 languages, and the package a page came from tells its language: the oracle for
language identification. `find_pages()` lists them in a fixed order (the same set on every
machine with the packages), `expected_language()` labels one page, and
`marin.web.sample_warc.write_warc` wraps pages into WARC files as a crawler would.

    pages = find_pages(per_manual=150)      # every Debian Reference page, 150 of each other manual

Install: `apt-get install debian-reference python3.11-doc cppreference-doc-en-html`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DOC_PACKAGES",
    "DocPage",
    "expected_language",
    "find_pages",
    "missing_packages",
    "paragraph_texts",
]

REFERENCE_DIR = "/usr/share/doc/debian-reference-common/docs"
PYTHON_DIR = "/usr/share/doc/python3.11/html"
CPP_DIR = "/usr/share/cppreference/doc/html/en"

# the Debian Reference's file suffix -> (its package, the ISO 639-1 language it is written in)
REFERENCE_LANGUAGES = {
    "en": "en", "de": "de", "es": "es", "fr": "fr", "id": "id", "it": "it", "ja": "ja",
    "pt": "pt", "pt-br": "pt", "zh-cn": "zh", "zh-tw": "zh",
}
DOC_PACKAGES = tuple(f"debian-reference-{s}" for s in REFERENCE_LANGUAGES) + ("python3.11-doc", "cppreference-doc-en-html")
# what marks each package installed: one file it always ships
_MARKERS = {**{f"debian-reference-{s}": f"{REFERENCE_DIR}/index.{s}.html" for s in REFERENCE_LANGUAGES},
            "python3.11-doc": f"{PYTHON_DIR}/library/os.html", "cppreference-doc-en-html": f"{CPP_DIR}/index.html"}


@dataclass(frozen=True)
class DocPage:
    """One installed HTML page: where it lies, the URL it is published at, its package and the
    language that package is written in (`expected_language` refines it for untranslated pages)."""

    path: str
    url: str
    package: str
    package_language: str

    def read(self) -> bytes:
        return Path(self.path).read_bytes()


def missing_packages() -> list[str]:
    """The documentation packages not installed here (by a file each always ships)."""
    return [name for name, marker in _MARKERS.items() if not os.path.exists(marker)]


def find_pages(per_manual: int | None = None) -> list[DocPage]:
    """Every Debian Reference page of every installed language, and `per_manual` pages (all if
    None) of the Python and C++ manuals, chosen by a hash of their path: the same pages, in the
    same order, wherever the same packages are installed."""
    pages = []
    for suffix, language in REFERENCE_LANGUAGES.items():
        for path in sorted(Path(REFERENCE_DIR).glob(f"*.{suffix}.html")):
            url = f"https://www.debian.org/doc/manuals/debian-reference/{path.name}"
            pages.append(DocPage(str(path), url, f"debian-reference-{suffix}", language))
    pages += _manual(PYTHON_DIR, "https://docs.python.org/3.11/", "python3.11-doc", per_manual)
    pages += _manual(CPP_DIR, "https://en.cppreference.com/w/", "cppreference-doc-en-html", per_manual)
    return pages


def _manual(root: str, base_url: str, package: str, limit: int | None) -> list[DocPage]:
    paths = sorted(Path(root).rglob("*.html"), key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).digest())
    return [DocPage(str(p), base_url + str(p.relative_to(root)), package, "en") for p in paths[:limit]]


_BLOCKS = re.compile(rb"<(p|li|dd)\b[^>]*>(.*?)</\1>", re.S | re.I)
_TAGS = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


def paragraph_texts(html: bytes) -> list[str]:
    """The text of each paragraph-like element (p, li, dd; not table cells, which hold commands and names that translations keep) of a page, tags removed and space
    collapsed; what `expected_language` compares between a translation and its original."""
    import html as html_module

    texts = []
    for _, body in _BLOCKS.findall(html):
        text = _SPACE.sub(" ", html_module.unescape(_TAGS.sub(" ", body.decode("utf-8", "replace")))).strip()
        if len(text) >= 20:
            texts.append(text)
    return texts


def expected_language(page: DocPage, untranslated: float = 0.7, translated: float = 0.3) -> str | None:
    """The language a page is written in, told without any language identifier: its package's
    language, except for a page of a translation that is mostly its English original left as it
    was (Debian Reference translations leave some pages untranslated), which is English.

    The share of the page's paragraph text (by characters) that appears word for word in the
    English original's paragraphs decides: at least `untranslated` -> "en"; at most `translated`
    -> the package's language; in between (half translated) -> None, a page whose language is
    not clear.
    """
    if page.package_language == "en" or not page.package.startswith("debian-reference-"):
        return page.package_language
    original = Path(page.path).name.rsplit(".", 2)[0] + ".en.html"
    english = set(paragraph_texts((Path(page.path).parent / original).read_bytes()))
    texts = paragraph_texts(page.read())
    total = sum(map(len, texts))
    if not total:
        return None
    shared = sum(len(t) for t in texts if t in english) / total
    if shared >= untranslated:
        return "en"
    if shared <= translated:
        return page.package_language
    return None
