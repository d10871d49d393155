"""The options of the ``prep`` commands (config dataclasses: command line and TOML)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import seed_check
from ..config import option
from ..errors import ConfigError

DEFAULT_BUCKETS = 1_000_000
INT64_MAX = 2 ** 63 - 1    # ids, row counts and cardinalities are stored as int64
MAX_BUCKETS = 2 ** 32 + 1  # hashing: 1 + crc32 (32 bits) % (N - 1) reaches every row


def _check(ok, problem: str):
    """A config ``check``: None where ``ok(value)``, else ``problem``."""
    return lambda v: None if ok(v) else problem


@dataclass
class SplitOptions:
    """Options of every ``prep`` command: which rows, and the validation split."""

    max_rows: int | None = option(None, "stop after this many data rows; none: all",
                                  check=_check(lambda v: v > 0, "must be > 0"))
    valid_fraction: float = option(0.0, "the last round(F * rows) rows go to --valid-out",
                                   check=_check(lambda v: 0 <= v < 1, "must be in [0, 1)"))
    valid_out: str | None = option(None, "validation file; none: OUT with .h5 -> .valid.h5")
    overwrite: bool = option(False, "replace an existing OUT (and validation file) that an "
                             "earlier prep wrote; anything else is never replaced")

    def validate(self) -> None:
        """Cross-field rules."""
        if self.valid_out is not None and not self.valid_fraction:
            raise ConfigError("--valid-out needs --valid-fraction > 0", collective=True)


@dataclass
class TableOptions(SplitOptions):
    """Options of the text-table commands (``prep criteo``, base of ``prep csv``)."""

    buckets: tuple[int, ...] | None = option(
        None, f"hashing: ids per field, one for all or one per field; none: {DEFAULT_BUCKETS}",
        check=_check(lambda v: v and min(v) >= 2 and max(v) <= MAX_BUCKETS,
                     "must be integers from 2 to 2**32 + 1 (ids are 1 + crc32 % (N - 1): a "
                     "larger N adds rows no value can reach)"))
    min_count: int | None = option(None, "a vocabulary instead of hashing: values seen >= K "
                                   "times get their own id; none: hashing",
                                   check=_check(lambda v: v > 0, "must be > 0"))
    vocabulary: str | None = option(None, "a dataset file whose vocabulary a prep "
                                    "--min-count run stored (the training file): the same "
                                    "ids for the same values, other values 1; its "
                                    "cardinalities")
    skip_bad_lines: bool = option(False, "skip and count bad lines instead of failing")
    unlabeled: bool = option(False, "the lines have no label (criteo: 39 fields, I1..I13, "
                             "C1..C26; csv: no --label): /label is written as zeros and the "
                             "file marked unlabeled, which predict scores and train and eval "
                             "refuse")
    compression: str = option("none", "compression of OUT's datasets (HDF5 filters; none: "
                              "read ~8x faster than lzf, largest; lzf: 2.3x smaller; gzip: "
                              "smaller still, slowest to read)",
                              choices=("none", "lzf", "gzip"))

    def validate(self) -> None:
        """Cross-field rules."""
        super().validate()
        if self.buckets is not None and self.min_count is not None:
            raise ConfigError("--buckets and --min-count exclude each other (hashing or a "
                              "vocabulary)", collective=True)
        if self.vocabulary is not None and (self.buckets, self.min_count) != (None, None):
            raise ConfigError("--vocabulary gives the ids: --buckets and --min-count are not "
                              "given with it", collective=True)
        if self.unlabeled and self.min_count is not None:
            raise ConfigError("--unlabeled with --min-count: a vocabulary made from this "
                              "file would give other ids than the training file's; give "
                              "that file's (--vocabulary TRAIN.h5), or hash both files "
                              "with the same --buckets", collective=True)


@dataclass
class CsvOptions(TableOptions):
    """Options of ``prep csv``."""

    label: str | None = option(None, "label column, a header name or 0-based index; "
                               "required but with --unlabeled")
    dense: str | None = option(None, "dense columns, comma list of names or indices",
                               repeat=True)
    sparse: str | None = option(None, "categorical columns, comma list of names or indices",
                                repeat=True)
    label_threshold: float | None = option(None, "label = 1 if value >= T else 0; none: the "
                                           "label must be 0 or 1",
                                           check=_check(math.isfinite, "must be finite"))
    sep: str = option(",", "field separator, one ASCII character (\\t or tab: a tab)",
                      check=_check(lambda v: separator(v) is not None,
                                   "must be one ASCII character (or \\t)"))
    header: bool = option(True, "the first line names the columns")
    dense_transform: str = option("log", "log: log1p(max(x, 0)); none: x",
                                  choices=("log", "none"))
    quoting: str = option("rfc4180", "rfc4180: a value in double quotes may hold the "
                          "separator, LFs and \"\" (one \"); none: quotes are data",
                          choices=("rfc4180", "none"))
    multi_hot: str | None = option(None, "multi-hot columns COL[:SEP] (SEP one character, "
                                   "default |; comma, tab; COL:: a colon), comma list or "
                                   "repeated: each value a list of items "
                                   "pooled by the model (train --pooling)", repeat=True)

    def validate(self) -> None:
        """Cross-field rules."""
        super().validate()
        if self.unlabeled and (self.label is not None or self.label_threshold is not None):
            raise ConfigError("--unlabeled: the lines have no label, so --label and "
                              "--label-threshold are not given", collective=True)
        if self.label is None and not self.unlabeled:
            raise ConfigError("--label is required (a column name or index; --unlabeled: "
                              "lines without one, to predict)", collective=True)
        if self.dense is None and self.sparse is None and self.multi_hot is None:
            raise ConfigError("give the feature columns: --dense, --sparse and/or --multi-hot",
                              collective=True)


def separator(text: str) -> str | None:
    """The separator character of ``--sep`` text, None if not a valid one."""
    sep = {"\\t": "\t", "tab": "\t"}.get(text, text)
    return sep if len(sep) == 1 and sep.isascii() and sep not in "\r\n" else None


@dataclass
class SyntheticOptions(SplitOptions):
    """Options of ``prep synthetic``."""

    rows: int = option(1_000_000, "rows to generate (train + validation)",
                       check=_check(lambda v: 0 < v <= INT64_MAX, "must be > 0 and < 2**63"))
    seed: int = option(0, "generator seed, 0 to 2**32 - 1", check=seed_check)
    max_cardinality: int = option(100_000, "cap of each field's cardinality (Criteo Kaggle's "
                                  "own, up to 10,131,227)",
                                  check=_check(lambda v: v >= 1, "must be >= 1"))
    zipf: float = option(1.1, "Zipf exponent of the ids (the law is truncated at each "
                         "field's cardinality, so any exponent >= 1 is a distribution)",
                         check=_check(lambda v: 1 <= v < math.inf, "must be >= 1 and finite"))

