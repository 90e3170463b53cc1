"""Per-key aggregations (`from zephyr import agg`): `count`, `sum`, `min`, `max`, `mean`, `first`,
`collect`, for `ds.group_by(key).agg(name=agg.count(), ...)` (see `grouped.py`)."""

from zephyr.aggregate.functions import Agg, collect, count, first, max, mean, min, sum  # noqa: A004

__all__ = ["Agg", "collect", "count", "first", "max", "mean", "min", "sum"]
