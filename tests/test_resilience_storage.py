"""Object-storage faults: transient errors are retried, permanent ones fail naming the path.

The pipeline runs in a subprocess whose STORAGE_EMULATOR_HOST points at a proxy in front of the
local GCS emulator (`faulty_gcs` in the root conftest); the proxy answers some requests with 503
(once, which gcsfs's own retries absorb), with 503 or a dropped connection several times in a
row (outlasting gcsfs's retries, so Zephyr sees the error: a lost attempt, not a user error),
or with 403 (always).
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
    name = sys.argv[3] if len(sys.argv) > 3 else "threadpool"
    options = {"init_kwargs": {"num_cpus": 4, "include_dashboard": False}} if name == "ray" else {}  # 4: the outages overlap
    backend = create_backend(name, max_parallelism=4, progress=False, **options)
    ds = Dataset.from_files(src).load_jsonl().filter(lambda r: r["i"] % 3).map(lambda r: {**r, "seen": True})
    execution = backend.execute(ds.write_jsonl(out + "/part-{shard:03d}.jsonl.zst"))
    print(len(list(execution)), "shards written")
    print("retries_user", sum(s.retries_user for s in execution.stats), "retries_lost", sum(s.retries_lost for s in execution.stats))
    print("storage_retries", execution.counters["zephyr/storage_retries"])
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


@pytest.fixture(scope="module")
def source(gcs_emulator, tmp_path_factory):
    """The module's pipeline script and bucket: the input shards under `raw/`, and under `clean/`
    the pipeline's output without faults, which a faulty run must equal. Each test writes under
    a prefix of its own."""
    script = tmp_path_factory.mktemp("pipeline") / "pipeline.py"
    script.write_text(PIPELINE)
    bucket = make_bucket()
    clean = run(script, gcs_emulator, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    return script, bucket


def run(script, endpoint, *args):
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)


def figures(stdout: str) -> dict[str, int]:
    words = stdout.split()
    return {name: int(words[words.index(name) + 1]) for name in ("retries_user", "retries_lost", "storage_retries")}


def read_outputs(bucket: str, prefix: str) -> dict:
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in sorted(fs.ls(f"{bucket}/{prefix}")) if not p.endswith(RECORD_NAME)}


def test_transient_errors_are_retried_and_the_output_is_unchanged(source, faulty_gcs):
    script, bucket = source
    proxy = faulty_gcs(transient_every=3)
    faulty = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/transient")
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    assert "6 shards written" in faulty.stdout
    assert proxy.injected_transient >= 3  # faults really happened (listing, reads and uploads)
    assert read_outputs(bucket, "transient") == read_outputs(bucket, "clean")


@pytest.mark.parametrize("backend", ["threadpool", pytest.param("ray", marks=pytest.mark.ray)])
def test_outages_outlasting_gcsfs_retries_are_lost_attempts_not_user_errors(source, faulty_gcs, backend):
    """Regression: a 5xx or dropped connection that survived gcsfs's retries inside a task was
    charged to the user's retry budget (0 locally, so the run failed; 1 on Ray)."""
    script, bucket = source
    out = f"outage-{backend}"
    proxy = faulty_gcs()
    # (downloads only: a worker without a cached listing also fetches metadata, and gcsfs falls
    # back between metadata calls in ways that absorb some failures)
    proxy.outage("raw%2Fpart-2.jsonl.zst?alt=media", times=6)  # reading shard 2: 503 x6
    proxy.outage("raw%2Fpart-5.jsonl.zst?alt=media", times=12, status=None)  # shard 5: dropped x12 (aiohttp retries too)
    proxy.outage(f"{out}/part-001.jsonl.zst", times=6)  # uploading shard 1's output: 503 x6
    faulty = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/{out}", backend)
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    assert "6 shards written" in faulty.stdout
    assert proxy.injected_outage == 6 + 12 + 6  # every outage happened in full
    counts = figures(faulty.stdout)
    assert counts["retries_user"] == 0  # the user's budget was not charged
    assert counts["retries_lost"] == counts["storage_retries"] >= 3  # one lost attempt per outage, at least
    assert "transient storage error" in faulty.stderr  # and the run said why it retried
    assert read_outputs(bucket, out) == read_outputs(bucket, "clean")


def test_a_permanent_error_fails_fast_with_the_path_in_the_message(source, faulty_gcs):
    script, bucket = source
    proxy = faulty_gcs(forbidden=("part-4.jsonl.zst?alt=media", "part-4.jsonl.zst&alt=media", "o/raw%2Fpart-4"))
    result = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/forbidden-read")
    assert result.returncode != 0
    assert proxy.injected_permanent == 1  # one request: neither gcsfs nor Zephyr retried a 403
    assert f"gs://{bucket}/raw/part-4.jsonl.zst" in result.stderr
    assert "shard 4" in result.stderr
    assert "transient storage error" not in result.stderr
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    written = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/forbidden-read")] if fs.exists(f"{bucket}/forbidden-read") else []
    assert "part-004.jsonl.zst" not in written


def test_a_forbidden_upload_fails_fast_naming_the_output_and_shard(source, faulty_gcs):
    script, bucket = source
    proxy = faulty_gcs()
    # the upload names its object in its metadata part (gcsfs's json.dumps); the run record,
    # which also mentions the output, is written as usual
    proxy.outage('{"name": "forbidden-write/part-003.jsonl.zst"}', times=1000, status=403)
    result = run(script, proxy.url, f"gs://{bucket}/raw/*.jsonl.zst", f"gs://{bucket}/forbidden-write")
    assert result.returncode != 0
    assert proxy.injected_outage == 1  # not retried
    assert f"gs://{bucket}/forbidden-write/part-003.jsonl.zst" in result.stderr and "shard 3" in result.stderr
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    assert "part-003.jsonl.zst" not in [p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/forbidden-write")]
