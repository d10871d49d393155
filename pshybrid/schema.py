"""The ground floor: what a dataset's rows look like and how the sparse fields map to table
rows. Pure (NumPy only, no MPI): data, models, checkpoints, benchmarks and the store all
read these definitions instead of writing them out again.

- ``Schema``: the fields of a dataset (dense count and names, sparse cardinalities and names).
- ``TableSpec``: one embedding table (rows x dim, dtype, initialisation, extra per-row slots).
- ``field_offsets``: where each sparse field starts in the fused table.
- ``FusedTable``: every sparse field in one table ``name``: field f's id i is global row
  ``offsets[f] + i``; a row holds the field's ``dim``-wide embedding followed by ``wide``
  extra columns (1 for the per-id linear weight of WDL and DeepFM, else 0). One table means
  one indexed Get and one Accumulate per server per step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError, InputError


# the way out of other ids for the same values (``Schema.difference``)
GROW = ("prep a later file with the first file's --vocabulary, or its --buckets: the tables "
        "cannot grow")


def names_problem(dense_names, sparse_names) -> str | None:
    """Why these field names cannot name a model's fields, or None: each becomes an HDF5
    name in checkpoints and exports (``/embeddings/<field>``), so none is empty, holds a
    '/' or is '.' or '..', and the categorical ones are distinct."""
    for kind, names in (("dense", dense_names), ("categorical", sparse_names)):
        for n in names:
            if not isinstance(n, str) or not n or "/" in n or n in (".", ".."):
                return (f"{kind} field name {n!r} cannot name a field (checkpoints and exports "
                        "store fields under their names: no '/', not '.', '..' or empty)")
    seen = set()
    for n in sparse_names:
        if n in seen:
            return f"categorical field name {n!r} is given twice (each field needs its own)"
        seen.add(n)
    return None


@dataclass(frozen=True)
class Schema:
    """What a model needs to know about its input: ``n_dense`` dense features and one
    categorical field per entry of ``cardinalities`` (ids in ``[0, cardinality)``); the last
    ``multi_hot`` of them are multi-hot (a list of ids per row, pooled by the model)."""

    n_dense: int
    cardinalities: tuple[int, ...]
    dense_names: tuple[str, ...] = ()
    sparse_names: tuple[str, ...] = ()
    multi_hot: int = 0
    # whose ids the values are: a digest of the vocabulary ``prep --min-count`` stored (None:
    # hashed, or not known); not in ``==``: ``difference`` compares it where both have one
    vocabulary: str | None = field(default=None, compare=False)
    # the item separator of each multi-hot field, in order (prep's; None: not recorded, as
    # in files of earlier versions); not in ``==``: ``difference`` compares it, as above
    separators: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self):
        if not self.dense_names:
            object.__setattr__(self, "dense_names", tuple(f"I{j + 1}" for j in range(self.n_dense)))
        if not self.sparse_names:
            object.__setattr__(self, "sparse_names",
                               tuple(f"C{f + 1}" for f in range(len(self.cardinalities))))

    @property
    def n_sparse(self) -> int:
        return len(self.cardinalities)

    @property
    def n_single(self) -> int:
        """The single-hot fields (the first ones): one id per row each."""
        return len(self.cardinalities) - self.multi_hot

    def to_dict(self) -> dict:
        """JSON-able form (checkpoint metadata); ``from_dict`` inverts it."""
        return {"n_dense": self.n_dense, "cardinalities": list(self.cardinalities),
                "dense_names": list(self.dense_names), "sparse_names": list(self.sparse_names),
                "multi_hot": self.multi_hot,
                **({"vocabulary": self.vocabulary} if self.vocabulary else {}),
                **({"separators": list(self.separators)} if self.separators else {})}

    def difference(self, other: Schema, mine: str, theirs: str,
                   names: bool = True) -> str | None:
        """The first way ``other`` (of ``theirs``) differs from this schema (of ``mine``), in
        words, with the way out for that kind of difference; None: the same (with ``names``
        False the field names are not compared)."""
        columns, ids = ("other columns: the files of one model are prepped with the same "
                        "--dense, --sparse and --multi-hot columns"), GROW
        found = [(what, a, b, columns) for what, a, b in (
            ("dense fields", self.n_dense, other.n_dense),
            ("categorical fields", self.n_sparse, other.n_sparse),
            ("multi-hot fields", self.multi_hot, other.multi_hot)) if a != b]
        for i, (name, card, oname, ocard) in enumerate(zip(
                self.sparse_names, self.cardinalities, other.sparse_names, other.cardinalities)):
            if names and name != oname:
                found.append((f"categorical field {i}", repr(name), repr(oname), columns))
            if card != ocard:
                found.append((f"the cardinality of field {i} ({name!r})", card, ocard, ids))
        for i, (name, oname) in enumerate(zip(self.dense_names, other.dense_names)):
            if names and name != oname:
                found.append((f"dense field {i}", repr(name), repr(oname), columns))
        if None not in (self.vocabulary, other.vocabulary) and self.vocabulary != other.vocabulary:
            found.append(("the vocabulary (the values the ids stand for, prep --min-count's)",
                          self.vocabulary, other.vocabulary, ids))
        for name, a, b in zip(self.sparse_names[self.n_single:], self.separators or (),
                              other.separators or ()):
            if a != b:
                found.append((f"the item separator of multi-hot field {name!r}", repr(a),
                              repr(b), f"prep it with the same --multi-hot {name}:SEP"))
        if not found:
            return None
        what, a, b, way = found[0]
        n = len(found) - 1
        more = f"; {n} more difference{'s' if n > 1 else ''}" if n else ""
        return f"{what}: {a} in {mine}, {b} in {theirs} ({way}{more})"

    @classmethod
    def from_dict(cls, d: dict) -> Schema:
        return cls(int(d["n_dense"]), tuple(int(c) for c in d["cardinalities"]),
                   tuple(d.get("dense_names", ())), tuple(d.get("sparse_names", ())),
                   int(d.get("multi_hot", 0)), d.get("vocabulary"),
                   tuple(d["separators"]) if d.get("separators") else None)


def file_provenance(attrs, path: str, multi_hot: list[str]) -> dict:
    """The ``Schema`` keywords a dataset file's attributes give (absent: None):
    ``vocabulary`` (attribute ``vocabulary_digest``: prep --min-count's, whose ids) and
    ``separators`` (attribute ``multi_hot_separators``: JSON {multi-hot field: its items'
    separator}, prep's, for each of ``multi_hot``)."""
    v, seps = attrs.get("vocabulary_digest"), attrs.get("multi_hot_separators")
    if seps is not None:
        try:
            d = json.loads(seps)
            seps = tuple(d[m] for m in multi_hot)
            if not all(isinstance(c, str) and len(c) == 1 for c in seps):
                raise ValueError
        except (ValueError, TypeError, KeyError):
            raise InputError(f"{path}: attribute multi_hot_separators is not a JSON object "
                             f"of each multi-hot field {multi_hot}'s separator (one character)"
                             ) from None
    return {"vocabulary": v and str(v), "separators": seps or None}


@dataclass(frozen=True)
class TableSpec:
    """One embedding table: ``rows`` x ``dim`` of ``dtype``.

    init: ``"uniform"`` (deterministic from seed, name and global row, see
    ``initializers``; values in ``[-init_scale, init_scale)``) or ``"zeros"``.
    slots: names of extra zero-initialised per-row regions kept beside the weights.
    """

    name: str
    rows: int
    dim: int
    dtype: str = "float32"
    init: str = "uniform"
    init_scale: float = 0.05
    slots: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the weights and every slot."""
        return self.rows * self.dim * np.dtype(self.dtype).itemsize * (1 + len(self.slots))

    def validate(self) -> None:
        if not self.name:
            raise ConfigError("table name must be non-empty")
        if self.rows < 1 or self.dim < 1:
            raise ConfigError(f"table {self.name!r}: rows and dim must be >= 1, got "
                              f"rows={self.rows} dim={self.dim}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"table {self.name!r}: dtype must be float32 or float64, "
                              f"got {self.dtype!r}")
        if self.init not in ("uniform", "zeros"):
            raise ConfigError(f"table {self.name!r}: init must be 'uniform' or 'zeros', "
                              f"got {self.init!r}")
        if "w" in self.slots or len(set(self.slots)) != len(self.slots):
            raise ConfigError(f"table {self.name!r}: slot names must be unique and not 'w'")


def field_offsets(cardinalities) -> np.ndarray:
    """(F,) int64: the first fused-table row of each field (the sum of the cardinalities
    before it)."""
    cards = np.asarray(cardinalities, np.int64)
    return np.concatenate(([0], np.cumsum(cards)[:-1])).astype(np.int64) if cards.size else cards


class FusedTable:
    """All sparse fields of ``schema`` in one table ``name`` of ``sum(cardinalities)`` rows
    and ``dim + wide`` columns (``table``: its TableSpec)."""

    def __init__(self, schema: Schema, dim: int, wide: int, dtype: str, name: str = "sparse",
                 init_scale: float = 0.05):
        self.schema, self.dim, self.wide = schema, dim, wide
        self.offsets = field_offsets(schema.cardinalities)
        self.table = TableSpec(name, rows=int(sum(schema.cardinalities)), dim=dim + wide,
                               dtype=dtype, init="uniform", init_scale=init_scale)

    def global_ids(self, sparse: np.ndarray) -> np.ndarray:
        """sparse: (B, F) per-field ids -> (B, F) int64 rows of the fused table."""
        return sparse.astype(np.int64, copy=False) + self.offsets

    def field_rows(self, f: int) -> slice:
        """The fused-table rows of field ``f``."""
        a = int(self.offsets[f])
        return slice(a, a + int(self.schema.cardinalities[f]))
