"""Per-task resource requests: parsing, and the user-error attempt budget on Ray."""

import pytest

from zephyr import Dataset, ShardError, create_backend
from zephyr.resources import parse_memory


@pytest.mark.parametrize(
    "text, expected",
    [("2GB", 2_000_000_000), ("512MiB", 512 * 2**20), ("2 GiB", 2 * 2**30), ("1.5g", 1_500_000_000), (4096, 4096), ("100", 100)],
)
def test_memory_sizes(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1GB", "0", "2XB", True, 0])
def test_bad_memory_sizes_are_clear_errors(bad):
    with pytest.raises(ValueError, match="memory must be"):
        parse_memory(bad)


def test_backend_records_its_task_resources():
    backend = create_backend("ray", max_parallelism=3, memory="2GB", num_cpus=2, num_gpus=1, resources={"TPU": 4, "TPU-v4-8-head": 1})
    res = backend.task_resources
    assert (res.memory, res.num_cpus, res.num_gpus, res.resources) == (2_000_000_000, 2, 1, {"TPU": 4, "TPU-v4-8-head": 1})
    assert "resources={'TPU': 4, 'TPU-v4-8-head': 1}" in backend.describe()
    with pytest.raises(ValueError, match="resources must map names to amounts"):
        create_backend("sync", resources={"TPU": "four"})


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
