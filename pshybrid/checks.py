"""The checks of option values (``config.option(check=...)``): each returns what is wrong
with a value, as the end of "--option: <problem>, got <value>", or None; and the hint for a
misspelt option name."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math

import numpy as np


def at_least(lo):
    return lambda v: None if v >= lo else f"must be >= {lo}"


SEED_RANGE = "must be an integer from 0 to 2**32 - 1"  # the tables' key takes 32 bits


def seed_check(v):
    """A seed: the initialisation and the synthetic stream use its low 32 bits
    (``initializers.table_key``), so a larger one would repeat a smaller one's tables."""
    return None if 0 <= v < 2**32 else SEED_RANGE


def positive(v):
    return None if v > 0 else "must be > 0"


def non_negative(v):
    return None if math.isfinite(v) and v >= 0 else "must be >= 0 and finite"


def decay(v):
    return None if 0 <= v < 1 else "must be >= 0 and < 1"


def finite_positive(v):
    return None if math.isfinite(v) and v > 0 else "must be > 0 and finite"


def zero_in(dtype: str, v) -> str | None:
    """An optimizer's eps that rounds to 0 in the kernels' ``dtype`` (g / 0 on a fresh row)."""
    if np.dtype(dtype).type(v) != 0:
        return None
    return (f"is 0 in {dtype} (g / 0 on a fresh row): must be >= "
            f"{np.finfo(dtype).smallest_subnormal:g}")


def layer_sizes(v):
    return None if v and all(n > 0 for n in v) else "must be a non-empty list of sizes > 0"


def close_names(name: str, names) -> str:
    """The end of an "unknown name" error: the close ones, else every known one."""
    close = difflib.get_close_matches(name, names)
    return f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names)}"


def hinted_keywords(cls):
    """Class decorator: ``cls(**kw)`` with an unknown keyword raises Python's TypeError with
    the close field names (a config built in Python, where TOML and flags already hint)."""
    init, names = cls.__init__, [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self, *args, **kw):
        unknown = [k for k in kw if k not in names]
        if unknown:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                            f"{unknown[0]!r}; {close_names(unknown[0], names)}")
        init(self, *args, **kw)
    cls.__init__ = __init__
    return cls
