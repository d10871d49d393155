"""A config written out: ``to_dict`` (JSON-able: a checkpoint's ``meta.json``, a metrics
file's first record) and ``to_toml`` (``--print-config``: a TOML file ``--config`` reads back
to the same config). Their readers are ``config.from_dict`` and ``config.resolve``."""

from __future__ import annotations

import dataclasses
import json


def _plain(v):
    """A NumPy scalar (a sweep over ``np.logspace``) as Python's; anything else as it is."""
    return v.item() if type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0 else v


def to_dict(cfg) -> dict:
    """``{field: value}`` of a config, JSON-able (tuples → lists; NumPy's scalars →
    Python's, which ``from_dict`` checks; None stays None)."""
    return {k: [_plain(x) for x in v] if isinstance(v, (tuple, list)) else _plain(v)
            for k, v in dataclasses.asdict(cfg).items()}


def to_toml(cfg) -> str:
    """A config as a TOML file that ``--config`` reads back to the same config: every field,
    one ``key = value`` line each (None as ``"none"``), but a field another replaces
    (``replaced_by``: ``steps`` under ``epochs``) as a comment."""
    def value(v) -> str:
        if v is None:
            return '"none"'
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, str):  # a JSON string, less its escapes of non-ASCII (surrogate
            return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # pairs)
        if isinstance(v, tuple):
            return "[" + ", ".join(map(str, v)) + "]"
        return repr(v)  # int; float (repr round-trips; inf and nan are TOML too)

    replaced = getattr(cfg, "replaced_by", lambda: {})()
    return "".join(("# " if f.name in replaced else "") + f"{f.name} = "
                   f"{value(getattr(cfg, f.name))}"
                   + (f"  ({replaced[f.name]} decides)" if f.name in replaced else "") + "\n"
                   for f in dataclasses.fields(cfg))
