"""The earlier path of :mod:`marin.training.tiny_lm` (kept so that existing imports work)."""

from marin.training.tiny_lm import *  # noqa: F403
from marin.training.tiny_lm import __all__  # noqa: F401
