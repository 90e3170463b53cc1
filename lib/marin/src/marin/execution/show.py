"""`marin steps RECORD_OR_PREFIX`: the steps of an experiment, each with its status, output path
and last error, read from what the executor recorded (the experiment record, each step's status
file and lease); runs nothing and takes no lease.

    marin steps scratch                                 # every experiment record under PREFIX/experiments
    marin steps scratch/experiments/quickstart-1a2b3c4d.json
    marin steps scratch --traceback                     # each failed step's whole traceback
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections.abc import Sequence
from typing import Any

from marin.execution import storage
from marin.execution.status import read_step_record
from marin.utils import fsspec_glob

__all__ = ["steps_main", "step_rows"]

NEVER_STARTED = "NOT STARTED"


def step_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per step of an experiment record: name, status (the step's status file, which
    outlives the record's snapshot), output path, and the error its last run recorded."""
    rows = []
    for step in record.get("steps", []):
        found = read_step_record(step["output_path"]) or {}
        rows.append({"name": step["name"], "status": found.get("status") or NEVER_STARTED,
                     "output_path": step["output_path"], "error": found.get("error"), "time": found.get("time")})
    return rows


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def format_rows(rows: list[dict[str, Any]], traceback: bool = False) -> str:
    width = max([len(r["name"]) for r in rows] + [4])
    status_width = max([len(r["status"]) for r in rows] + [6])
    out = [f"{'STEP'.ljust(width)}  {'STATUS'.ljust(status_width)}  OUTPUT"]
    for row in rows:
        out.append(f"{row['name'].ljust(width)}  {row['status'].ljust(status_width)}  {row['output_path']}")
        if row["error"]:
            if traceback:
                out.extend("    " + line for line in row["error"].rstrip().splitlines())
            else:
                out.append(f"    last error: {_last_line(row['error'])}")
    return "\n".join(out)


def _records(target: str) -> list[str]:
    if target.endswith(".json"):
        return [target]
    found = sorted(fsspec_glob(f"{glob.escape(target.rstrip('/'))}/experiments/*.json"))  # the prefix taken literally
    if not found:
        raise FileNotFoundError(f"no experiment record under {target.rstrip('/')}/experiments/ (is {target!r} the executor's prefix?)")
    return found


def steps_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="marin steps", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="an experiment record (PREFIX/experiments/NAME.json) or the executor's prefix")
    parser.add_argument("--traceback", action="store_true", help="print each failed step's whole recorded traceback")
    args = parser.parse_args(list(argv))
    try:
        paths = _records(args.target)
        for i, path in enumerate(paths):
            record = storage.read_json(path)
            if record is None:
                raise FileNotFoundError(f"no experiment record at {path}")
            header = f"{path} ({record.get('date', '?')}, {record.get('caller', '?')})"
            print(("\n" if i else "") + header)
            print(format_rows(step_rows(record), args.traceback))
    except (FileNotFoundError, ValueError) as e:
        print(f"marin steps: error: {e}", file=sys.stderr)
        return 1
    return 0
