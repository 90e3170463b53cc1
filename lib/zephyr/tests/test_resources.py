"""Per-task resource requests: parsing, and the user-error attempt budget on Ray."""

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephyr import Dataset, ShardError, create_backend
from zephyr.resources import parse_memory

UNIT_BYTES = {"": 1, "B": 1, "KB": 1000, "K": 1000, "MB": 1000**2, "M": 1000**2, "GB": 1000**3, "G": 1000**3,
              "TB": 1000**4, "KiB": 1024, "Ki": 1024, "MiB": 1024**2, "Mi": 1024**2, "GiB": 1024**3, "Gi": 1024**3,
              "TiB": 1024**4, "Ti": 1024**4}


# The oracle: what a user writes -> bytes, worked out by hand. The union of what the two
# former parsers accepted (zephyr's took "512Mi" and ".5G", marin's ray_run took "0").
MEMORY_SIZES = [
    ("2GB", 2_000_000_000), ("2gb", 2_000_000_000), ("2 GB", 2_000_000_000), ("2G", 2_000_000_000),
    ("512MiB", 536_870_912), ("512Mi", 536_870_912), ("512mi", 536_870_912), ("2 GiB", 2_147_483_648),
    ("1.5g", 1_500_000_000), ("1.5G", 1_500_000_000), (".5G", 500_000_000), ("1.5KiB", 1536),
    ("1.001GB", 1_001_000_000), ("4.35GB", 4_350_000_000), ("1.003MB", 1_003_000),  # exact, not 1000999999
    ("1.0001KB", 1000),  # a fraction of a byte is dropped
    ("3Ti", 3_298_534_883_328), ("1TB", 10**12), ("1PiB", 2**50), ("7K", 7000), ("7k", 7000), ("7Ki", 7168),
    ("100", 100), (" 7 ", 7), ("64B", 64), ("1e9", 10**9), ("2.5e3MB", 2_500_000_000),
    (4096, 4096), (2e9, 2_000_000_000), (1.9, 1), (None, None),
]
BAD_MEMORY_SIZES = ["lots", "", "0", "0GB", "0.0", 0, 0.0, "0.5", 0.4, "-1GB", "-5", -5, "2XB", "2 G B", "1 2GB",
                    "GB", "inf", "nan", float("inf"), float("nan"), True, [1]]


@pytest.mark.parametrize("text, expected", MEMORY_SIZES)
def test_memory_sizes(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", BAD_MEMORY_SIZES)
def test_bad_memory_sizes_are_clear_errors_naming_the_value(bad):
    with pytest.raises(ValueError, match="memory must be") as failed:
        parse_memory(bad)
    assert repr(bad) in str(failed.value)


@given(st.integers(1, 10**6), st.integers(0, 999), st.sampled_from(sorted(UNIT_BYTES)), st.sampled_from(["", " "]))
def test_any_decimal_size_with_any_unit(whole, thousandths, unit, space):
    """Regression: "1.001GB" was 1000999999 bytes (float arithmetic) in both former parsers."""
    text = f"{whole}.{thousandths:03d}{space}{unit}"
    assert parse_memory(text) == math.floor(Fraction(text.removesuffix(unit).strip()) * UNIT_BYTES[unit])


def test_backend_records_its_task_resources():
    backend = create_backend("ray", max_parallelism=3, memory="2GB", num_cpus=2, num_gpus=1, resources={"TPU": 4, "TPU-v4-8-head": 1})
    res = backend.task_resources
    assert (res.memory, res.num_cpus, res.num_gpus, res.resources) == (2_000_000_000, 2, 1, {"TPU": 4, "TPU-v4-8-head": 1})
    assert "resources={'TPU': 4, 'TPU-v4-8-head': 1}" in backend.describe()
    with pytest.raises(ValueError, match="resources must map names to amounts"):
        create_backend("sync", resources={"TPU": "four"})


@pytest.mark.parametrize("options", [{"num_cpus": math.nan}, {"num_gpus": math.inf}, {"resources": {"TPU": -4}},
                                     {"resources": {"TPU": math.nan}}])
def test_unreservable_amounts_are_refused_when_the_backend_is_made(options):
    """Regression: NaN, infinite and negative amounts were kept, and Ray refused them only at the
    first task, with a traceback from its option checks (local backends never did)."""
    with pytest.raises(ValueError, match=r"finite numbers >= 0"):
        create_backend("threadpool", **options)


@pytest.mark.ray
def test_a_user_error_on_ray_is_tried_twice_then_fails(ray_shared, tmp_path):
    def flaky_forever(x):
        (tmp_path / f"attempt-{x}-{__import__('uuid').uuid4().hex}").touch()
        raise RuntimeError("always broken")

    backend = create_backend("ray", progress=False)
    execution = backend.execute(Dataset.from_list([7]).map(flaky_forever))
    with pytest.raises(ShardError, match="always broken"):
        list(execution)
    assert len(list(tmp_path.glob("attempt-7-*"))) == 2  # one retry (max_user_retries=1), then the error
    assert execution.stats[0].retries_user == 1 and execution.stats[0].retries_lost == 0
