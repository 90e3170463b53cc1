"""The executor's step lease: one implementation, in `zephyr.io.lease` (re-exported)."""

from zephyr.io.lease import *  # noqa: F403
from zephyr.io.lease import __all__  # noqa: F401
