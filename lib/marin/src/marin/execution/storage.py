"""The executor's file operations: one implementation, in `zephyr.io.storage` (re-exported)."""

from zephyr.io.storage import *  # noqa: F403
from zephyr.io.storage import __all__  # noqa: F401
