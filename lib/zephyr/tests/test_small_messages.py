"""The small things a new user meets first (issue 24, item 10): a directory given to from_files,
memory printed in units, and the progress bar's rate for stages that hand back no items."""

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, create_backend
from zephyr.plan.compile import Stage
from zephyr.execution.progress import make_progress
from zephyr.resources import format_memory, parse_memory
from zephyr.tasks import ShardResult


@pytest.mark.parametrize("suffix", ["", "/"])
def test_from_files_on_a_directory_says_it_is_one_and_what_to_write(tmp_path, suffix):
    """Regression (issue 24): `from_files("raw/")` said an existing directory "does not exist"."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text("{}\n")
    pattern = f"{tmp_path}/raw{suffix}"
    with pytest.raises(FileNotFoundError) as info:
        list(create_backend("sync").execute(Dataset.from_files(pattern).load_jsonl()))
    message = str(info.value)
    assert f"Input {pattern!r} is a directory" in message and "does not exist" not in message
    assert f"from_files('{tmp_path}/raw/*.jsonl')" in message


def test_from_files_on_a_missing_path_still_says_it_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(create_backend("sync").execute(Dataset.from_files(str(tmp_path / "nope.jsonl"))))


@pytest.mark.parametrize("given_as, shown", [("2GB", "2 GB"), ("512MiB", "512 MiB"), ("1.5GB", "1.5 GB"), ("3Gi", "3 GiB")])
def test_backend_description_prints_memory_in_units(given_as, shown):
    """Regression (issue 24): the summary line said memory=2000000000."""
    assert f"memory={shown}" in create_backend("sync", memory=given_as).describe()


@settings(max_examples=200)
@given(n=st.integers(1, 10**15))
def test_format_memory_reads_back_exactly(n):
    """Whatever the size, what is printed is what `--memory` would read back as the same bytes."""
    assert parse_memory(format_memory(n).replace(" ", "")) == n


def test_progress_rate_counts_the_records_a_write_stage_read(monkeypatch):
    """Regression (issue 24): a 2,400-record write stage showed `0 items/s`."""
    monkeypatch.setattr("sys.stderr", io.StringIO())
    stage = Stage(index=0, input=(), ops=(), num_shards=1)
    bar = make_progress(True, stage)
    bar.update(ShardResult(shard=0, items=None, counters={}, num_items=0, items_in=2400))
    rate = bar._bar.postfix.split(" items/s")[0]
    bar.close()
    assert float(rate.replace(",", "")) > 0
