"""Main text from crawled HTML: the page's headings and paragraphs without its navigation,
menus and footers.

`resiliparse`'s main-content extractor is the default; `trafilatura` is the option. Measured on
465 Debian documentation pages (benchmarks/README.md section 16), resiliparse kept 99-100% of
the headings, dropped every navigation link and ran 20x faster (9 ms against 187 ms a page);
trafilatura kept more of the link-dense paragraphs of the Debian Reference but lost its
headings. `HtmlExtractor` is the pipeline step (a `flat_map` function) that turns a
`load_warc()` record into a text record, counting every page it drops and why:

    Dataset.from_files("crawl/*.warc.gz").load_warc(on_bad_record="skip").flat_map(HtmlExtractor())

Counters (`web/extract/...`): `pages`, `kept`, `not_html` (a PDF, an image: dropped), `binary`
(a payload declared HTML that holds NUL bytes), `empty` (no text left), `decode_replaced`
(bytes that no encoding could decode were replaced, U+FFFD, and the page kept), `error` (the
extractor raised: the page is dropped, the run goes on).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from zephyr import counters

__all__ = ["EXTRACTORS", "HtmlExtractor", "decode_html", "extract_text"]

EXTRACTORS = ("resiliparse", "trafilatura")
_HTML_TYPES = ("text/html", "application/xhtml+xml", "application/xml", "text/xml")
_TEXT_TYPES = ("text/plain",)  # WET conversion records: the crawler's own text


def decode_html(content: bytes, charset: str | None) -> tuple[str, bool]:
    """The page as text and whether bytes had to be replaced: the declared charset if it decodes
    the bytes, else the encoding `resiliparse` detects, else UTF-8 with U+FFFD for what is left."""
    from resiliparse.parse.encoding import detect_encoding

    for encoding in (charset, detect_encoding(content)):
        if encoding and _known(encoding):
            try:
                return content.decode(encoding), False
            except UnicodeDecodeError:
                continue
    return content.decode("utf-8", errors="replace"), True


def _known(encoding: str) -> bool:
    try:
        codecs.lookup(encoding)
        return True
    except LookupError:
        return False


def extract_text(html: str, method: str = "resiliparse") -> str:
    """The main text of a page: blocks on their own lines, navigation and boilerplate dropped."""
    if method == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        return extract_plain_text(html, main_content=True, alt_texts=False)
    if method == "trafilatura":
        try:
            import trafilatura
        except ImportError as e:
            raise ImportError("HtmlExtractor(method='trafilatura') needs the trafilatura package: uv add trafilatura") from e
        return trafilatura.extract(html, include_comments=False, include_tables=True) or ""
    raise ValueError(f"extraction method must be one of {EXTRACTORS}, got {method!r}")


@dataclass(frozen=True)
class HtmlExtractor:
    """A `flat_map` step: a crawl record (`load_warc()`: `url`, `content_type`, `charset`,
    `content` bytes) -> `[record]` with `text` in place of `content`, or `[]` for a page with
    no text to keep (counted by reason, see the module)."""

    method: str = "resiliparse"

    def __post_init__(self) -> None:
        if self.method not in EXTRACTORS:
            raise ValueError(f"HtmlExtractor method must be one of {EXTRACTORS}, got {self.method!r}")

    def __call__(self, record: dict) -> list[dict]:
        counters.increment("web/extract/pages")
        text = self._text(record)
        if text is None:
            return []
        text = text.strip()
        if not text:
            counters.increment("web/extract/empty")
            return []
        counters.increment("web/extract/kept")
        kept = {k: v for k, v in record.items() if k != "content"}
        kept["text"] = text
        return [kept]

    def _text(self, record: dict) -> str | None:
        content_type = (record.get("content_type") or "text/html").lower()
        content = record["content"]
        if content_type not in _HTML_TYPES and content_type not in _TEXT_TYPES:
            counters.increment("web/extract/not_html")
            return None
        if content.count(b"\x00", 0, 4096):  # declared text, holds binary: an image, an archive
            counters.increment("web/extract/binary")
            return None
        text, replaced = decode_html(content, record.get("charset"))
        if replaced:
            counters.increment("web/extract/decode_replaced")
        if content_type in _TEXT_TYPES:
            return text
        try:
            return extract_text(text, self.method)
        except ImportError:
            raise
        except Exception:  # noqa: BLE001 - a page the extractor cannot parse is dropped and counted, never the run
            counters.increment("web/extract/error")
            return None
