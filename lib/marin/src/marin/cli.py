"""The `marin` command: `marin cluster ...` (see `marin.cluster.cli`), `marin run ...` (ray_run) and
`marin steps ...` (an experiment's steps, see `marin.execution.show`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from marin.cluster import cli as cluster_cli
from marin.execution import show
from marin.run import ray_run

__all__ = ["main"]

_USAGE = """usage: marin COMMAND ...

commands:
  cluster   manage clusters and jobs: marin cluster --cluster NAME COMMAND (see marin cluster --help)
  run       submit a job: marin run [ray_run options] -- COMMAND (same as python -m marin.run.ray_run)
  steps     an experiment's steps with status, output path and last error: marin steps PREFIX_OR_RECORD
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "cluster":
        return cluster_cli.main(rest)
    if command == "run":
        return ray_run.main(rest)
    if command == "steps":
        return show.steps_main(rest)
    print(f"marin: unknown command {command!r}\n{_USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
