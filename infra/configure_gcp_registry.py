#!/usr/bin/env python
"""Set the cleanup policy of an Artifact Registry repository (thin wrapper of marin.cluster.registry).

    uv run python infra/configure_gcp_registry.py marin --region=us-central2 [--project=P] [--dry-run]
"""

import sys

from marin.cluster.registry import main

if __name__ == "__main__":
    sys.exit(main())
