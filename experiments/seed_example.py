"""The example from the infra README, runnable as written:

    uv run zephyr --backend=ray --max-parallelism=200 --memory=2GB experiments/seed_example.py

It makes a few small input files under a scratch directory (or uses `ZEPHYR_EXAMPLE_DIR`),
then processes each into an output file, skipping the ones already done, so a second run
does nothing. The `__main__` block at the end (not in the guide) makes
`python experiments/seed_example.py` run it too, on the default backend; `zephyr` runs it the same.
"""

import os
import tempfile

import fsspec

from zephyr import Dataset, flow_backend

WORK_DIR = os.environ.get("ZEPHYR_EXAMPLE_DIR") or os.path.join(tempfile.gettempdir(), "zephyr-seed-example")


def _make_inputs() -> list[dict]:
    files = []
    for i in range(4):
        src = f"{WORK_DIR}/input/part-{i}.txt"
        if not os.path.exists(src):
            with fsspec.open(src, "w", auto_mkdir=True) as f:
                f.write("\n".join(f"line {j} of file {i}" for j in range(100)))
        files.append({"input": src, "output": f"{WORK_DIR}/output/part-{i}.txt"})
    return files


def output_exists(f: dict) -> bool:
    return os.path.exists(f["output"])


def process_file(input_path: str, output_path: str) -> None:
    with fsspec.open(input_path, "r") as src, fsspec.open(output_path, "w", auto_mkdir=True) as dst:
        for line in src:
            dst.write(line.upper())


input_files = _make_inputs()


def main():
    backend = flow_backend()  # Backend configured via CLI flags
    pipeline = (
        Dataset.from_list(input_files)
        .filter(lambda f: not output_exists(f))
        .map(lambda f: process_file(f["input"], f["output"]))
    )
    list(backend.execute(pipeline))
    out_dir = f"{WORK_DIR}/output"  # absent before the first real run (`zephyr --dry-run` writes nothing)
    print(f"outputs in {out_dir}: {sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []}")


if __name__ == "__main__":
    main()
