"""The Debian documentation pages the web tests run on, wrapped into WARC files once per session.

The packages must be installed (`.ci/run` installs them): in CI (env CI set) a test that needs
them fails when they are missing; elsewhere it is skipped, saying which to install.
"""

from __future__ import annotations

import os

import pytest

from marin.web.debian_docs import DocPage, find_pages, missing_packages

PER_MANUAL = 150  # the fixed benchmark set: every Debian Reference page, 150 Python and 150 C++ pages


def require_doc_packages() -> None:
    missing = missing_packages()
    if not missing:
        return
    message = f"Debian documentation packages missing: {' '.join(missing)} (apt-get install them; .ci/run does)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def doc_pages() -> list[DocPage]:
    require_doc_packages()
    return find_pages(per_manual=PER_MANUAL)
