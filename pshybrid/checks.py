"""The checks of option values (``config.option(check=...)``): each returns what is wrong
with a value, as the end of "--option: <problem>, got <value>", or None."""

from __future__ import annotations

import math


def at_least(lo):
    return lambda v: None if v >= lo else f"must be >= {lo}"


SEED_RANGE = "must be an integer from 0 to 2**32 - 1"  # the tables' key takes 32 bits


def seed_check(v):
    """A seed: the initialisation and the synthetic stream use its low 32 bits
    (``initializers.table_key``), so a larger one would repeat a smaller one's tables."""
    return None if 0 <= v < 2**32 else SEED_RANGE


def positive(v):
    return None if v > 0 else "must be > 0"


def learning_rate(v):
    return None if math.isfinite(v) and v >= 0 else "must be >= 0 and finite"


def layer_sizes(v):
    return None if v and all(n > 0 for n in v) else "must be a non-empty list of sizes > 0"
