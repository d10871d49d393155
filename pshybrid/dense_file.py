"""A checkpoint's ``dense.h5`` read and checked (``checkpoint_files`` has the layout):
/flat and /state/<slot> (``read_dense``), the attributes params and param_steps, and
``pshybrid.torch``'s /buffers/<name> and /torch_state/<name>/<key>."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from .checkpoint_files import DAMAGE, bad_key, is_int, open_h5
from .checksums import Sums
from .errors import InputError

TORCH_STATE = "torch_state"  # the group of a torch optimizer's state beside the slots


def _dense_sums(fpath: str, flat, state: dict) -> None:
    """Check /flat and /state/<slot> of ``fpath`` against their checksums."""
    sums = Sums(fpath, True)
    sums.add("flat", flat)
    for k, v in state.items():
        sums.add(f"state/{k}", v)
    with open_h5(fpath) as f:
        sums.read(f)
    sums.check()


def read_param_steps(step_dir: str, names) -> dict | None:
    """{name: steps} of ``dense.h5``'s attribute param_steps (``pshybrid.torch``'s Adam:
    each parameter's own step count), each name one of ``names`` (attribute params'); None
    where absent (a native checkpoint, or one written before they were kept)."""
    fpath = os.path.join(step_dir, "dense.h5")
    with open_h5(fpath) as f:
        if "param_steps" not in f.attrs:
            return None
        try:
            steps = json.loads(f.attrs["param_steps"])
        except (ValueError, TypeError):
            steps = None
    if not (isinstance(steps, dict) and all(is_int(v) and v >= 0 for v in steps.values())):
        raise bad_key(fpath, "attribute param_steps", "is not a JSON object of counts >= 0")
    other = sorted(set(steps) - set(names))
    if other:
        raise bad_key(fpath, "attribute param_steps", f"names {other[0]!r}, not a parameter")
    return steps


def _read_group(step_dir: str, group: str) -> dict:
    """{path under ``group``: array} of ``dense.h5``'s numeric datasets there (none where
    it is absent), each against its checksum (written with them from the first)."""
    fpath = os.path.join(step_dir, "dense.h5")
    out = {}
    with open_h5(fpath) as f:
        try:
            grp = f.get(group)
            if grp is not None and not isinstance(grp, h5py.Group):
                raise bad_key(fpath, f"/{group}", "is not a group")
            found = []
            if grp is not None:
                grp.visititems(lambda name, d: found.append((name, d))
                               if isinstance(d, h5py.Dataset) else None)
            for name, d in found:
                if d.dtype.kind not in "fiub":
                    raise bad_key(fpath, f"/{group}/{name}", "is not a numeric dataset")
                out[name] = d[...]
                sums = Sums(fpath, True)
                sums.add(f"{group}/{name}", out[name])
                sums.read(f)
                sums.check()
        except DAMAGE as e:
            raise InputError(f"{fpath}: corrupt or truncated ({e})") from None
    return out


def read_buffers(step_dir: str) -> dict:
    """{name: array} of ``dense.h5``'s /buffers (a torch model's buffers; none in a native
    checkpoint or one written before they were kept)."""
    return _read_group(step_dir, "buffers")


def read_torch_state(step_dir: str, names) -> dict:
    """{name: {key: array}} of ``dense.h5``'s /torch_state/<name>/<key> (the state of a
    ``pshybrid.torch`` optimizer kept beside the slots: a momentum buffer, RMSprop's
    averages, ...), each name one of ``names`` (attribute params'); none where absent."""
    out: dict = {}
    for path, a in _read_group(step_dir, TORCH_STATE).items():
        name, _, key = path.rpartition("/")
        fpath = os.path.join(step_dir, "dense.h5")
        if name not in names:
            raise bad_key(fpath, f"/{TORCH_STATE}/{path}", f"names {name!r}, not a parameter")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise bad_key(fpath, f"/{TORCH_STATE}/{path}", "has a non-finite value")
        out.setdefault(name, {})[key] = a
    return out


def read_dense(step_dir: str, slots: tuple[str, ...], size: int | None = None,
               checksums: bool = False):
    """(flat, {slot: (P,)}, params) of ``dense.h5``, checked: /flat 1-D floats (``size``
    of them if given), finite; attrs params a JSON list of [name, offset, shape] inside
    /flat; /state/<slot> exactly the dense optimizer's slots, each like /flat; with
    ``checksums``, every array against its checksum."""
    fpath = os.path.join(step_dir, "dense.h5")
    with open_h5(fpath) as f:
        try:
            d = f.get("flat")
            if not isinstance(d, h5py.Dataset) or d.ndim != 1 or d.dtype.kind != "f":
                raise bad_key(fpath, "/flat", "is missing or not a 1-D float dataset")
            flat = d[...]
            P = flat.shape[0]
            if size is not None and P != size:
                raise bad_key(fpath, "/flat", f"holds {P} dense parameters, the model has {size}")
            if not np.isfinite(flat).all():
                raise bad_key(fpath, "/flat", "has a non-finite value")
            try:
                params = json.loads(f.attrs["params"])
            except (KeyError, ValueError, TypeError):
                raise bad_key(fpath, "attribute params", "is missing or not JSON") from None
            names, total = set(), 0
            for item in params if isinstance(params, list) and params else [None]:
                if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                        and item[0] and item[0] not in names and is_int(item[1]) and item[1] >= 0
                        and isinstance(item[2], list) and all(is_int(x) and x >= 0
                                                               for x in item[2])):
                    raise bad_key(fpath, "attribute params", f"entry {str(item)[:60]} is not a "
                                  "distinct [name, offset, shape]")
                names.add(item[0])
                total += int(np.prod(item[2], dtype=object))
            if total != P:
                raise bad_key(fpath, "/flat", f"holds {P} values, attribute params describes "
                              f"{total}")
            for name, off, shape in params:
                if off + int(np.prod(shape, dtype=object)) > P:
                    raise bad_key(fpath, "attribute params", f"entry {name!r} ends past /flat")
            grp = f.get("state", {})
            have = set(grp.keys()) if isinstance(grp, (h5py.Group, dict)) else {"?"}
            if have != set(slots):
                raise bad_key(fpath, "/state", f"holds {sorted(have)}, the dense optimizer keeps "
                              f"{sorted(slots)}")
            state = {}
            for k in slots:
                d = grp[k]
                if not isinstance(d, h5py.Dataset) or d.shape != (P,) or d.dtype.kind != "f":
                    raise bad_key(fpath, f"/state/{k}", f"must be ({P},) floats like /flat")
                state[k] = d[...]
                if not np.isfinite(state[k]).all():
                    raise bad_key(fpath, f"/state/{k}", "has a non-finite value")
        except DAMAGE as e:
            raise InputError(f"{fpath}: corrupt or truncated ({e})") from None
    if checksums:
        _dense_sums(fpath, flat, state)
    return flat, state, params
