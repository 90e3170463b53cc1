"""The seed command's first minutes (issue 24): wall time and console lines of

    uv run zephyr --backend=BACKEND --max-parallelism=2 seed.py

over six 200-line JSONL files (load, filter, map, write with skip_existing), on threadpool and
on an embedded Ray, first run and rerun (every output present), each command timed from the
shell as a user runs it (`uv run` included); the baseline is the embedded Ray with Ray's own
default under `uv run` (each worker started through `uv run`), with `--verbose` (its console
lines are what a clean run printed before issue 24). Prints a Markdown table; `--json` keeps the figures.

    uv run python benchmarks/bench_first_minutes.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SEED = textwrap.dedent(
    """
    import json, os
    from zephyr import Dataset, flow_backend

    WORK = os.environ["SEED_DIR"]

    def main():
        os.makedirs(f"{WORK}/raw", exist_ok=True)
        for i in range(6):
            path = f"{WORK}/raw/part-{i}.jsonl"
            if not os.path.exists(path):
                with open(path, "w") as f:
                    f.writelines(json.dumps({"id": f"{i}-{j}", "text": "word " * (j % 30)}) + "\\n" for j in range(200))
        ds = (Dataset.from_files(f"{WORK}/raw/*.jsonl").load_jsonl()
              .filter(lambda d: len(d["text"]) > 20)
              .map(lambda d: {**d, "n": len(d["text"].split())})
              .write_jsonl(f"{WORK}/out/{{shard:05d}}.jsonl", skip_existing=True))
        print(len(list(flow_backend().execute(ds))), "outputs")
    """
)


def run_once(script: Path, work: Path, backend: str, env: dict) -> tuple[float, int]:
    backend, *flags = backend.split()
    local = ["--local-ray=embedded"] if backend == "ray" else []  # this benchmark's subject (issue 41 reuses one instead)
    command = ["uv", "run", "zephyr", f"--backend={backend}", *local, *flags, "--max-parallelism=2", str(script)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env={**env, "SEED_DIR": str(work)}, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return elapsed, len((done.stdout + done.stderr).splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (the median is shown)")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_ADDRESS")}
    figures: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "seed.py"
        script.write_text(SEED)
        for backend in ("threadpool", "ray"):
            for _ in range(args.repeats):
                work = Path(tmp) / f"work-{backend}"
                shutil.rmtree(work, ignore_errors=True)
                figures.setdefault(f"{backend} first", []).append(run_once(script, work, backend, env))
                figures.setdefault(f"{backend} rerun", []).append(run_once(script, work, backend, env))
        # the baseline: Ray's own default under `uv run` (workers through `uv run`), which the
        # embedded Ray keeps when the user sets the variable
        uv_env = {**env, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "1"}
        for _ in range(args.repeats):
            work = Path(tmp) / "work-ray-uv"
            shutil.rmtree(work, ignore_errors=True)
            figures.setdefault("ray first, workers through uv run (RAY_ENABLE_UV_RUN_RUNTIME_ENV=1)", []).append(
                run_once(script, work, "ray --verbose", uv_env))
    print("| command | median wall s | runs (s) | console lines |")
    print("|---|---|---|---|")
    for name, runs in figures.items():
        times = [t for t, _ in runs]
        print(f"| {name} | {statistics.median(times):.1f} | {', '.join(f'{t:.1f}' for t in times)} | {max(n for _, n in runs)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [{"wall_s": t, "lines": n} for t, n in v] for k, v in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
