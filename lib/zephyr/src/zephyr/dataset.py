"""The Dataset builder at its public path (`zephyr.dataset`, as the reference project has it);
it lives in `zephyr.plan.dataset`, beside the op records and the planner."""

from zephyr.plan.dataset import Dataset, ShardInfo

__all__ = ["Dataset", "ShardInfo"]
