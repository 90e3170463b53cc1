"""How Marin's INFO lines (steps run and skipped, training metrics) reach the console.

Two callers, one handler: ``executor_main`` (the program's entry point) and each TPU host
task (a Ray worker, whose stderr Ray forwards to the driver). Neither overrides logging the
program configured itself.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "show_marin_lines"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def show_marin_lines() -> None:
    """Give the ``marin`` logger its own INFO handler on stderr, unless it already has one.

    The lines go through this handler only (``propagate = False``): a library that puts a
    handler on the root logger, before or after (absl does when JAX is imported), would
    otherwise hide them behind its WARNING level or print each a second time.
    """
    marin_logger = logging.getLogger("marin")
    if marin_logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    marin_logger.addHandler(handler)
    marin_logger.setLevel(logging.INFO)
    marin_logger.propagate = False
