"""The earlier path of :mod:`marin.training.token_cache` (kept so that existing imports work)."""

from marin.training.token_cache import *  # noqa: F403
from marin.training.token_cache import __all__  # noqa: F401
