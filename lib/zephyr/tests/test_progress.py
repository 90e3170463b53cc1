"""What a person watches: per-stage bars when asked for (or on a terminal) and the summary."""

from zephyr import Dataset, counters, create_backend
from zephyr.execution.summary import format_summary


def tagged(x):
    counters.increment("seen")
    return x


def test_progress_bars_per_stage_and_summary(capsys):
    backend = create_backend("sync", progress=True)
    ds = Dataset.from_list(list(range(3))).map(tagged).group_by(lambda x: x % 2, lambda k, items: (k, sum(items)))
    execution = backend.execute(ds)
    assert sorted(execution) == [(0, 2), (1, 1)]
    err = capsys.readouterr().err
    assert "stage 0: 100%" in err and "3/3" in err  # the map stage: shards done / total
    assert "stage 1: 100%" in err and "items/s" in err and "MB/s in" in err
    summary = format_summary(execution)
    assert "stage 0: 3 shards" in summary and "stage 1: 3 shards" in summary
    assert "seen" in summary and "zephyr/shuffle_records" in summary


def test_quiet_when_not_on_a_terminal(capsys):
    backend = create_backend("sync")  # progress=None: bars only if stderr is a terminal (it is not here)
    assert list(backend.execute(Dataset.from_list([1, 2]).map(tagged))) == [1, 2]
    assert capsys.readouterr().err == ""
