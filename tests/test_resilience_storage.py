"""Object-storage faults: transient errors are retried, permanent ones fail naming the path.

The pipeline runs in a subprocess whose STORAGE_EMULATOR_HOST points at a proxy in front of the
local GCS emulator; the proxy answers some requests with 503 (once) or 403 (always).
"""

import os
import subprocess
import sys
import textwrap
import uuid

import fsspec
import pytest
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output

pytestmark = [pytest.mark.resilience, pytest.mark.slow]

PIPELINE = textwrap.dedent(
    """
    import sys
    from zephyr import Dataset, create_backend

    src, out = sys.argv[1], sys.argv[2]
    backend = create_backend("threadpool", max_parallelism=4, progress=False)
    ds = Dataset.from_files(src).load_jsonl().filter(lambda r: r["i"] % 3).map(lambda r: {**r, "seen": True})
    print(len(list(backend.execute(ds.write_jsonl(out + "/part-{shard:03d}.jsonl.zst")))), "shards written")
    """
)


def make_bucket(prefix: str = "raw") -> str:
    bucket = f"faults-{uuid.uuid4().hex[:10]}"
    fs = fsspec.filesystem("gs")
    fs.mkdir(bucket)
    for shard in range(6):
        with fsspec.open(f"gs://{bucket}/{prefix}/part-{shard}.jsonl.zst", "wb", compression="zstd") as f:
            f.write(b"".join(b'{"i": %d, "shard": %d}\n' % (i, shard) for i in range(300)))
    fs.invalidate_cache()
    return bucket


def run(script, endpoint, *args):
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)


def read_outputs(bucket: str, prefix: str) -> dict:
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in sorted(fs.ls(f"{bucket}/{prefix}")) if not p.endswith(RECORD_NAME)}


def test_transient_errors_are_retried_and_the_output_is_unchanged(tmp_path, gcs_emulator, faulty_gcs):
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE)
    bucket = make_bucket()
    clean = run(script, gcs_emulator, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/clean")
    assert clean.returncode == 0, clean.stderr[-3000:]

    proxy = faulty_gcs(transient_every=3)
    faulty = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/faulty")
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    assert "6 shards written" in faulty.stdout
    assert proxy.injected_transient >= 3  # faults really happened (listing, reads and uploads)
    assert read_outputs(bucket, "faulty") == read_outputs(bucket, "clean")


def test_a_permanent_error_fails_with_the_path_in_the_message(tmp_path, faulty_gcs):
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE)
    bucket = make_bucket()
    proxy = faulty_gcs(forbidden=("part-4.jsonl.zst?alt=media", "part-4.jsonl.zst&alt=media", "o/raw%2Fpart-4"))
    result = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/out")
    assert result.returncode != 0
    assert proxy.injected_permanent >= 1
    assert f"gs://{bucket}/raw/part-4.jsonl.zst" in result.stderr
    assert "shard 4" in result.stderr
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    written = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/out")] if fs.exists(f"{bucket}/out") else []
    assert "part-004.jsonl.zst" not in written
