#!/usr/bin/env python
"""Thin wrapper: `uv run scripts/ray/cluster.py ARGS` is `marin cluster ARGS` (marin.cluster.cli)."""

import sys

from marin.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="scripts/ray/cluster.py"))
