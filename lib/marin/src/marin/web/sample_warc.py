"""Real pages as a crawl: Debian's documentation wrapped into WARC files, as a crawler writes them.

    uv run python -m marin.web.sample_warc scratch/debian-warc          # 465 pages in 4 files (+ --duplicates, --bad-pages)
    uv run python experiments/curate_web.py --input 'scratch/debian-warc/*.warc.gz' --output scratch/web

One HTTP response record per page (gzipped per record, with digests), written by
`zephyr.io.write_warc_file`; the same installed packages give the same bytes. `bad_pages()`
gives the pages no run may stop on: a binary payload, a page in a broken encoding, a 20 MB page;
`copied_pages()` the copies a crawl holds (a page again at a mirror, a page with a line added).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable

from marin.web.debian_docs import DocPage, find_pages, missing_packages
from zephyr.io import write_warc_file

__all__ = ["COPY_HOSTS", "DATE", "bad_pages", "copied_pages", "original_url", "page_record", "write_sample_warcs"]

DATE = "2026-01-01T00:00:00Z"  # one crawl date for every page: the files are deterministic
COPY_HOSTS = {"exact": "mirror.example", "near": "archive.example"}  # where copied_pages puts each kind of copy
_NEAR_COPY_NOTE = b" (This copy of the page was archived on the first of January 2026.)"
_PARAGRAPH = re.compile(rb"<p\b[^>]*>(.*?)</p>", re.S | re.I)


def page_record(page: DocPage) -> dict:
    """A `write_warc_file` record for one page (Debian's HTML is UTF-8 throughout)."""
    return {"url": page.url, "date": DATE, "content_type": "text/html", "charset": "utf-8", "content": page.read()}


def bad_pages(size: int = 20 * 1024 * 1024) -> list[dict]:
    """Pages that must never stop a run: a PNG served as HTML, a PDF, text in a broken encoding
    (invalid UTF-8 declared UTF-8), a `size`-byte page, and an empty body."""
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 64
    broken = "<html><body><h1>Caf\xe9 cr\xe8me</h1><p>".encode("latin-1") + b"\xff\xfe\xfd " * 500 + b"</p></body></html>"
    paragraph = b"<p>" + b"All work and no play makes a long page. " * 25 + b"</p>\n"
    huge = b"<html><body><h1>A huge page</h1>" + paragraph * (size // len(paragraph)) + b"</body></html>"
    return [
        {"url": "https://bad.example/image.html", "date": DATE, "content_type": "text/html", "charset": "utf-8", "content": png},
        {"url": "https://bad.example/doc.pdf", "date": DATE, "content_type": "application/pdf", "charset": None,
         "content": b"%PDF-1.4\n" + bytes(range(256)) * 64},
        {"url": "https://bad.example/broken.html", "date": DATE, "content_type": "text/html", "charset": "utf-8", "content": broken},
        {"url": "https://bad.example/huge.html", "date": DATE, "content_type": "text/html", "charset": "utf-8", "content": huge},
        {"url": "https://bad.example/empty.html", "date": DATE, "content_type": "text/html", "charset": "utf-8", "content": b""},
    ]


def copied_pages(pages: Iterable[DocPage], every: int = 4) -> list[dict]:
    """Duplicates as crawls hold them: every `every`-th page again, byte for byte, at a mirror
    (`https://mirror.example/<host>/<path>`: an exact duplicate), and the page `every // 2`
    after it with an archive note added to its longest paragraph (main text, not navigation:
    at `archive.example`, a near duplicate). `original_url` maps a copy's URL back to its page's."""
    pages = list(pages)
    copies = []
    for kind, start in (("exact", 0), ("near", every // 2)):
        for page in pages[start::every]:
            record = page_record(page)
            record["url"] = f"https://{COPY_HOSTS[kind]}/{page.url.split('://', 1)[1]}"
            if kind == "near":
                html = record["content"]
                at = max(_PARAGRAPH.finditer(html), key=lambda m: m.end() - m.start(), default=None)
                at = at.end(1) if at else len(html)
                record["content"] = html[:at] + _NEAR_COPY_NOTE + html[at:]
            copies.append(record)
    return copies


def original_url(url: str) -> str:
    """The URL of the page a `copied_pages` copy was made from (any other URL as it is)."""
    host, _, rest = url.removeprefix("https://").partition("/")
    return f"https://{rest}" if host in COPY_HOSTS.values() else url


def write_sample_warcs(output_dir: str, pages: Iterable[DocPage] | None = None, num_files: int = 4,
                       extra: Iterable[dict] = ()) -> list[str]:
    """Write `pages` (default: `find_pages(per_manual=150)`) and `extra` records round-robin into
    `num_files` files `output_dir/pages-NNNNN.warc.gz`; returns their paths."""
    records = [page_record(p) for p in (find_pages(per_manual=150) if pages is None else pages)] + list(extra)
    paths = [os.path.join(output_dir, f"pages-{i:05d}.warc.gz") for i in range(num_files)]
    for i, path in enumerate(paths):
        write_warc_file(records[i::num_files], path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="where the .warc.gz files go (a local path or any fsspec URL)")
    parser.add_argument("--per-manual", type=int, default=150, help="pages of the Python and C++ manuals each (default 150)")
    parser.add_argument("--files", type=int, default=4, help="how many WARC files (default 4)")
    parser.add_argument("--bad-pages", action="store_true", help="add the pages no run may stop on (binary, broken, 20 MB)")
    parser.add_argument("--duplicates", action="store_true",
                        help="add copies of every 4th page: exact (at a mirror) and near (a line added), for dedup to find")
    args = parser.parse_args(argv)
    if missing := missing_packages():
        parser.error(f"Debian documentation packages missing: {' '.join(missing)} (apt-get install them)")
    pages = find_pages(args.per_manual)
    extra = (copied_pages(pages) if args.duplicates else []) + (bad_pages() if args.bad_pages else [])
    paths = write_sample_warcs(args.output_dir, pages, args.files, extra)
    print("\n".join(paths))


if __name__ == "__main__":
    main()
