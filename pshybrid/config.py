"""Configuration: one dataclass per concern ⇄ command-line options ⇄ TOML file.

Each field of a config dataclass is one option (``batch_size`` → ``--batch-size``) and one TOML
key (``batch_size`` or ``batch-size``). ``resolve`` starts from the defaults, overlays the
``--config FILE`` TOML file, then the options given on the command line (the command line wins),
and validates every field. Field metadata (see ``option``): ``help``, ``choices`` and
``check(value) -> error string | None``; a dataclass may add ``validate(self)`` for cross-field
rules. Every error is a ``ConfigError`` naming the option or key; it is ``collective``: each
rank parses the same arguments and reaches the same verdict. Supported field types: ``int``,
``float``, ``str``, ``bool`` (``--flag/--no-flag``), the ``X | None`` of all but bool (``none``
on the command line, ``"none"`` in TOML), and ``tuple[int, ...]`` (``1024,512,256`` on the
command line; an array of integers or that string in TOML). ``to_toml`` writes a config as a
TOML file that reads back to it, ``to_dict`` as JSON (both in ``configout``)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
import types
import typing
from dataclasses import dataclass

from .checks import (at_least, close_names, decay, finite_positive, hinted_keywords,
                     layer_sizes, non_negative, positive, seed_check, zero_in)
from .configout import to_dict, to_toml  # noqa: F401 (config's own API: written out there)
from .errors import ConfigError
from .models import MODELS
from .optim import DENSE_LR, SCHEDULES, SLOTS, SPARSE_LR
from .registry import MODES, PLACEMENTS, consistency_error, refusal


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError (same on every rank) instead of exiting, and takes
    whole option names only, as TOML keys (a script's ``--batch`` would break with a second)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):
        # (the top-level parser's name is already the error line's "pshybrid: error:")
        where = "" if self.prog == "pshybrid" else f"{self.prog}: "
        raise ConfigError(f"{where}{message}", collective=True)


def option(default, help: str, *, choices: tuple | None = None, check=None, repeat: bool = False):
    """A config field: ``default``, one-line ``help``, allowed ``choices``, and ``check``.
    ``repeat`` (a str field): the option may be given several times, and a TOML array of
    strings is accepted; the values are joined with commas."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices,
                                                        "check": check, "repeat": repeat})


class _Join(argparse.Action):
    """A repeated option: its values joined with commas."""

    def __call__(self, parser, namespace, values, option_string=None):
        old = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, values if old is None else f"{old},{values}")


def _error(message: str) -> ConfigError:
    return ConfigError(message, collective=True)


_EXPECTED = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             tuple: "comma-separated integers"}


def _kind(tp) -> tuple[type, bool]:
    """``(base, optional)`` of a supported field type; base is int, float, str, bool or tuple."""
    args = typing.get_args(tp)
    optional = (typing.get_origin(tp) in (types.UnionType, typing.Union)
                and len(args) == 2 and type(None) in args)
    tp = next(a for a in args if a is not type(None)) if optional else tp
    if typing.get_origin(tp) is tuple and typing.get_args(tp) == (int, ...):
        return tuple, optional
    if tp in (int, float, str) or (tp is bool and not optional):
        return tp, optional
    raise TypeError(f"unsupported config field type {tp!r}")


def _fields(cls) -> list[tuple[dataclasses.Field, type, bool]]:
    hints = typing.get_type_hints(cls)
    return [(f, *_kind(hints[f.name])) for f in dataclasses.fields(cls)]


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def shown(value) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """Add ``--config FILE`` and one ``--kebab-name`` option per field of dataclass ``cls``,
    each defaulting to ``argparse.SUPPRESS`` (absent from the namespace unless given) and
    keeping its text: ``resolve`` converts and checks them; a class's ``GROUPS`` ({title:
    field names}) puts them in sections of --help, in that order."""
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML file with any of these options, as keys (the command "
                             "line wins)")
    groups = getattr(cls, "GROUPS", {})  # --help's sections: {title: field names}
    sections = {title: parser.add_argument_group(title) for title in groups}
    where = {name: sections[title] for title, names in groups.items() for name in names}
    for f, base, optional in _fields(cls):
        text = f"{f.metadata.get('help', '')} (default: {shown(f.default)})".replace("%", "%%")
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.metadata.get("repeat"):
            kwargs["action"] = _Join
        elif f.metadata.get("choices"):
            none = ["none"] if optional else []
            kwargs["choices"] = [*map(shown, f.metadata["choices"]), *none]
        where.get(f.name, parser).add_argument(option_flag(f.name), **kwargs)


def _from_text(text, base: type, optional: bool, where: str):
    """A command-line value (text, or a bool from a flag) → the field's value."""
    if optional and text == "none":
        return None
    if base in (str, bool):
        return text
    try:
        return tuple(int(s) for s in text.split(",")) if base is tuple else base(text)
    except ValueError:
        raise _error(f"{where}: expected {_EXPECTED[base]}, got {text!r}") from None


def _typed(value, base: type, optional: bool, where: str):
    """A TOML / stored value → the field's value (int → float, list → tuple), type-checked; an
    optional one takes ``"none"`` (TOML has no null), not a blank string (an unset ``$VAR``)."""
    if optional and (value is None or (isinstance(value, str) and value == "none")):
        return None
    if optional and isinstance(value, str) and not value.strip():
        raise _error(f"{where}: must be a value (or none), got {value!r}")
    if base is tuple and isinstance(value, str):
        return _from_text(value, base, optional, where)
    if base is tuple and type(value) is int:  # one value, as "--buckets 10" on the command line
        return (value,)
    if base is float and type(value) is int:
        value = float(value)
    if base is tuple and isinstance(value, (list, tuple)):
        value = tuple(value)
        if all(type(v) is int for v in value):
            return value
    elif type(value) is base:
        return value
    expected = "an array of integers" if base is tuple else _EXPECTED[base]
    raise _error(f"{where}: expected {expected}, got {value!r}")


def _keyed(cls, d: dict, source: str) -> tuple[dict, dict]:
    """Map the keys of ``d`` (``_`` or ``-``) to field names: ``(values, where)``."""
    names = [f.name for f in dataclasses.fields(cls)]
    values, where = {}, {}
    for key, value in d.items():
        name = key.replace("-", "_")
        if name not in names:
            raise _error(f"unknown key {key!r} in {source}; {close_names(name, names)}")
        if name in values:
            raise _error(f"key {key!r} given twice in {source}")
        values[name], where[name] = value, f"{key} (in {source})"
    return values, where


def _build(cls, values: dict, where: dict, **checks):
    """Defaults overlaid with ``values``; every field type-, choice- and range-checked; then
    the class's ``validate(**checks)``."""
    kwargs = {}
    for f, base, optional in _fields(cls):
        label = where.get(f.name, f.name)
        value = values.get(f.name, f.default)
        if f.metadata.get("repeat") and isinstance(value, list) and value and \
                all(type(v) in (str, int) for v in value):
            value = ",".join(map(str, value))         # a TOML array (of names or indices)
        value = _typed(value, base, optional, label)
        choices, check = f.metadata.get("choices"), f.metadata.get("check")
        if value is not None and choices and value not in choices:
            raise _error(f"{label}: must be one of {', '.join(map(shown, choices))}, got {value!r}")
        if value is not None and check and (problem := check(value)):
            raise _error(f"{label}: {problem}, got "
                         f"{shown(value) if isinstance(value, tuple) and value else repr(value)}")
        kwargs[f.name] = value
    cfg = cls(**kwargs)
    if hasattr(cfg, "validate"):
        try:
            cfg.validate(**checks)
        except ConfigError as e:  # name the file of each option the message names that a
            defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # file set
            optional = {f.name for f, _, opt in _fields(cls) if opt}
            files = [where[n].replace(" (in ", " in ")[:-1] + (  # a stored option: how to drop
                f": {option_flag(n)} none drops it" if n in optional
                and where[n].endswith("meta.json)") else "") for n in values
                     if where.get(n, "").endswith(")") and " (in " in where[n]
                     and getattr(cfg, n) != defaults.get(n)
                     and re.search(re.escape(option_flag(n)) + r"(?![\w-])", str(e))]
            if not files:
                raise
            raise _error(f"{e} (from {'; '.join(files)})") from None
    return cfg


def _read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise _error(f"--config {path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _error(f"--config {path}: invalid TOML: {exc}") from None


def given(cls, ns: argparse.Namespace, name: str):
    """Option ``name`` as the command line, else the ``--config`` file, gives it (unchecked),
    or None: what must be known before resolving (``--resume``'s options are a layer below)."""
    if hasattr(ns, name):
        return getattr(ns, name)
    if getattr(ns, "config", None) is not None:
        return _keyed(cls, _read_toml(ns.config), ns.config)[0].get(name)
    return None


def resolve(cls, ns: argparse.Namespace, base: dict | None = None, base_source: str = ""):
    """The ``cls`` instance of defaults < ``base`` (a resumed checkpoint's options, from
    ``base_source``) < ``--config`` TOML file < command-line options. A class may define
    ``layer(values, given)`` to settle options that replace each other (``given``: the names
    the layer set) and ``settle(values, given, where)`` to check the final values."""
    values, where = _keyed(cls, base, base_source) if base else ({}, {})
    layer = getattr(cls, "layer", lambda values, given, source=None: None)
    toml: dict = {}
    if getattr(ns, "config", None) is not None:
        toml, at = _keyed(cls, _read_toml(ns.config), ns.config)
        values.update(toml)
        where.update(at)
        layer(values, set(toml), ns.config)  # the file over the checkpoint's options
    given: set[str] = set()
    for f, kind, optional in _fields(cls):
        if hasattr(ns, f.name):
            where[f.name] = option_flag(f.name)
            values[f.name] = _from_text(getattr(ns, f.name), kind, optional, where[f.name])
            given.add(f.name)
    layer(values, given)  # the command line over both
    getattr(cls, "settle", lambda *a: None)(values, given | (set(toml) & set(values)), where)
    return _build(cls, values, where)


def from_dict(cls, d: dict, source: str, **checks):
    """Inverse of ``to_dict`` (a config stored in a checkpoint), checked like a TOML file
    (``checks``: for ``validate``; missing keys take defaults); errors name ``source``."""
    return _build(cls, *_keyed(cls, d, source), **checks)


def _by_optimizer(rates: dict, rows: bool) -> str:
    """Default ``rates`` as --help says them: each optimizer's, and (``rows``) a model's own
    beside it (``row_rates``)."""
    return ", ".join(f"{r:g} with {k}" + "".join(f" ({c.row_rates[k]:g} for {n})" for n, c in
                                                 MODELS.items() if rows and k in c.row_rates)
                     for k, r in rates.items())


@hinted_keywords
@dataclass
class TrainConfig:
    """Options of ``python -m pshybrid train``."""

    GROUPS: typing.ClassVar[dict] = {  # (--help's sections; every field is in one)
        "model": ("model", "embedding_dim", "mlp", "cross_layers", "bottom_mlp", "pooling", "dtype",
                  "seed"),
        "data": ("data", "batch_size", "steps", "epochs", "shuffle", "eval_data", "eval_every",
                 "prefetch"),
        "optimizers": ("sparse_optimizer", "lr", "dense_optimizer", "dense_lr", "l2",
                       "beta1", "beta2", "eps", "lr_schedule", "warmup_steps"),
        "modes": ("mode", "servers", "placement", "replicate_rows", "consistency", "cache_rows",
                  "auto_trial_steps", "shared_memory", "server_threads", "bucket_mb"),
        "devices": ("device", "cuda_aware", "cuda_graphs"),
        "checkpoints and stalls": ("checkpoint_dir", "checkpoint_every", "keep_last", "resume",
                                   "init_from", "step_timeout"),
        "output": ("progress", "log_every", "metrics", "tensorboard")}
    # (option, what needs it, its value without): refused without, dropped by ``layer``'s none
    NEEDS: typing.ClassVar[tuple] = (("data", "epochs", None), ("eval_data", "eval_every", 0),
                                     ("checkpoint_dir", "checkpoint_every", 0),
                                     ("checkpoint_dir", "keep_last", 0))

    model: str = option("wdl", "model architecture", choices=MODELS)  # (live: added ones count)
    mode: str = option("hybrid", "communication: " + "; ".join(
                       f"{m.name}: {m.help}" for m in MODES.values()), choices=MODES)
    servers: int | None = option(None, "number of server ranks (none: one per node)",
                                 check=at_least(0))
    replicate_rows: int = option(0, "the N most frequent rows of the table on every worker, "
                                 "updated through an Allreduce beside the dense one (hybrid, "
                                 "CPU workers; exact); 0: none", check=at_least(0))
    placement: str = option("dedicated", "where the table shards live: on server ranks that "
                            "only serve (dedicated), or on every rank, each of which also "
                            "trains (colocated; --servers is refused)",
                            choices=tuple(PLACEMENTS))
    data: str | None = option(None, "training dataset: a file, several (comma-separated or "
                              "repeated: read as their concatenation, in the order given) or "
                              "a directory (its *.h5 files by name); none: built-in synthetic "
                              "stream", repeat=True)
    eval_data: str | None = option(None, "evaluation dataset (exact AUC and logloss): files "
                                   "or a directory, as --data", repeat=True)
    eval_every: int = option(0, "evaluate every K steps (0: only at the end)", check=at_least(0))
    shuffle: bool = option(True, "block-shuffle --data each epoch (blocks of 1024 rows, by --seed)")
    batch_size: int = option(128, "batch size per worker", check=positive)
    steps: int = option(2000, "number of training steps", check=at_least(0))
    epochs: int | None = option(None, "number of passes over --data (instead of --steps)",
                                check=positive)
    lr: float | None = option(None, "learning rate of the embedding rows (sparse optimizer; "
                              f"none: {_by_optimizer(SPARSE_LR, True)})", check=non_negative)
    dense_optimizer: str = option("adam", "optimizer of the dense (MLP) parameters",
                                  choices=("sgd", "adam"))
    sparse_optimizer: str = option("adagrad", "optimizer of the embedding rows", choices=SLOTS)
    dense_lr: float | None = option(None, "learning rate of the dense parameters (none: "
                                    f"{_by_optimizer(DENSE_LR, False)})", check=non_negative)
    bucket_mb: float = option(1.0, "Allreduce the dense gradients in buckets of at least this "
                              "many MiB while backward runs (0: one Allreduce after backward; "
                              "GPU workers: cut then, started after the step's one host sync)",
                              check=non_negative)
    prefetch: int | None = option(None, "batches prepared ahead on a background thread "
                                  "(none: 2 on a rank with >= 2 cores, else 0)",
                                  check=at_least(0))
    server_threads: int | None = option(None, "threads of a rank's optimizer apply on its "
                                        "table shard (a server's, or a colocated rank's); "
                                        "none: one per core the rank has (its binding, else "
                                        "the node's cores / ranks per node), at least 1; a "
                                        "dedicated server adds its part of the node's spare "
                                        "cores", check=positive)
    embedding_dim: int = option(16, "embedding dimension", check=positive)
    mlp: tuple[int, ...] = option((256, 128), "hidden layer sizes of the MLP, comma-separated "
                                  "(dlrm: its top MLP, over the interaction)", check=layer_sizes)
    cross_layers: int = option(2, "number of cross layers (dcn, dcnv2)", check=at_least(0))
    bottom_mlp: tuple[int, ...] = option((64,), "dlrm only: hidden layer sizes of its bottom "
                                         "MLP, over the dense features", check=layer_sizes)
    seed: int = option(0, "random seed, 0 to 2**32 - 1", check=seed_check)
    consistency: str = option("bsp", "consistency of embedding reads: bsp (every read sees "
                              "every update of the earlier steps), ssp:K (a read at step t "
                              "sees every update of the steps before t-K; the next step's "
                              "rows are pulled while this one runs), asp (no bound); dense "
                              "weights stay synchronous", check=consistency_error)
    cache_rows: int = option(0, "rows of the worker's hot-row cache, served without a pull "
                             "while they meet the --consistency bound (never under bsp or "
                             "ssp:0; under ssp:1 only the step after the start or a "
                             "checkpoint); 0: none", check=at_least(0))
    shared_memory: str = option("auto", "workers read the servers' rows straight from shared "
                                "memory (auto: every server's on a single-node job, the "
                                "servers' on the worker's own node on several, where the MPI "
                                "shares them; on: single-node jobs; off: RMA Gets, as between "
                                "nodes)", choices=("auto", "on", "off"))
    device: str = option("cpu", "device of the workers", choices=("cpu", "cuda"))
    cuda_aware: str = option("auto", "--device cuda: hand GPU buffers to MPI (on), or stage "
                             "them through pinned host memory (off); auto: as the MPI "
                             "library reports (MPIX_Query_cuda_support)",
                             choices=("auto", "on", "off"))
    cuda_graphs: str = option("auto", "--device cuda: each step's device work as one CUDA "
                              "graph (on), or kernel by kernel (off: the path run on a GPU "
                              "so far); auto: on, off with multi-hot fields (varying pooling)",
                              choices=("auto", "on", "off"))
    dtype: str = option("float32", "floating-point type of parameters and activations",
                        choices=("float32", "float64"))
    metrics: str | None = option(None, "JSON-lines file of per-step and evaluation metrics")
    tensorboard: str | None = option(None, "directory for TensorBoard event files of the same "
                                     "scalars (needs tensorboardX: pip install "
                                     "'pshybrid[tensorboard]')")
    progress: str = option("auto", "worker 0's progress: bar (one line redrawn), lines (one per "
                           "log), none; auto: bar when the job was started from an interactive "
                           "terminal, else lines", choices=("auto", "bar", "lines", "none"))
    log_every: int = option(100, "log (and write metrics) every this many steps", check=positive)
    checkpoint_dir: str | None = option(None, "directory for checkpoints (none: no checkpoints)")
    checkpoint_every: int = option(0, "save a checkpoint every K steps (0: never periodically)",
                                   check=at_least(0))
    resume: str | None = option(None, "checkpoint directory to resume from")
    init_from: str | None = option(None, "checkpoint (a directory, its step-N or best) whose "
                                   "model and optimizer state a new run starts from: at step 0, "
                                   "--data from its first row, a fresh --lr-schedule; the "
                                   "model's options must match it; not with --resume")
    keep_last: int = option(0, "keep only the newest K checkpoints (0: keep all)",
                            check=at_least(0))
    step_timeout: float | None = option(600.0, "seconds a worker may spend in one step (the "
                                        "first: 600 s at least) before the job ends naming "
                                        "it, a rank stopped or stuck; a warning at 60 s; "
                                        "none: no limit", check=at_least(1))
    l2: float = option(0.0, "L2 penalty lambda: every update uses g + lambda*w, on the dense "
                       "weights and on the embedding rows a step touches",
                       check=non_negative)
    beta1: float = option(0.9, "adam's decay of its gradient average m (embedding rows and "
                          "dense weights alike)", check=decay)
    beta2: float = option(0.999, "adam's decay of its squared-gradient average v",
                          check=decay)
    eps: float = option(1e-8, "the term adagrad and adam add to the root of their average "
                        "in the update's denominator", check=finite_positive)
    lr_schedule: str = option("constant", "learning-rate factor per step, the same for "
                              "--lr and --dense-lr: constant, warmup-linear (linear decay "
                              "to 0 after the warm-up) or cosine (cosine decay to 0)",
                              choices=SCHEDULES)
    warmup_steps: int = option(0, "steps of linear warm-up (factor s/K at step s <= K) "
                               "before the schedule", check=at_least(0))
    pooling: str = option("sum", "how the embeddings of a multi-hot field's ids are pooled "
                          "into one per row: their sum or their mean", choices=("sum", "mean"))
    auto_trial_steps: int = option(20, "--mode auto: train the cost model's leading "
                                   "alternatives this many timed steps each (after 3 warm-up "
                                   "steps) and pick the fastest measured (within 5%: the "
                                   "first in the table's order; 0: the model alone)",
                                   check=at_least(0))

    def replaced_by(self) -> dict:
        """{field: the option that decides it instead in this config} (``to_toml`` comments
        it out)."""
        out = {"steps": "--epochs"} if self.epochs is not None else {}
        if self.mode == "auto":
            out.update(placement="--mode auto", replicate_rows="--mode auto")
        return out

    @staticmethod
    def layer(values: dict, given: set, source: str | None = None) -> None:
        """Options given on top of a lower layer (a resumed checkpoint's): ``--steps`` and
        ``--epochs`` replace each other (both given is refused, naming ``source``, the TOML file
        that gave them; one given drops the other); ``--mode auto`` given drops a lower layer's
        placement options at their defaults (a ``--print-config``'s: no choice);
        ``--checkpoint-dir none`` / ``--eval-data none`` / ``--data none`` given drop the
        options that need them, unless those are given too; ``--resume`` given (not ``none``)
        drops a lower layer's ``--init-from`` (the resumed run's, a --config file's: how it
        began)."""
        if {"steps", "epochs"} <= given and values["epochs"] not in (None, "none"):
            both = (f"steps = {values['steps']} and epochs = {values['epochs']} in {source}"
                    if source else f"--steps {values['steps']} and --epochs {values['epochs']}")
            raise _error(f"{both}: give one (--epochs counts passes over --data, --steps the "
                         "steps)")
        if "steps" in given and "epochs" not in given:
            values["epochs"] = None
        if "resume" in given and "init_from" not in given and values["resume"] not in (
                None, "none"):  # (a resumed run's own start; --resume none: no resume)
            values["init_from"] = None
        auto = "mode" in given and values["mode"] == "auto"  # (it chooses these two)
        for k in {"placement", "replicate_rows"} - given if auto else ():
            if str(values.get(k)) == shown(TrainConfig.__dataclass_fields__[k].default):
                values.pop(k)  # (a lower layer's default: no choice, so it gives way)
        for key, other, off in TrainConfig.NEEDS:
            if key in given and values[key] in (None, "none") and other not in given:
                values[other] = off

    @staticmethod
    def settle(values: dict, given: set, where: dict) -> None:
        """After every layer (``given``: the names the TOML file or the command line set,
        ``where`` says which): ``--mode auto`` chooses ``--placement`` and
        ``--replicate-rows``, so neither may be given, even at its default; a resumed
        checkpoint's (what auto chose for the run that wrote it) gives way."""
        if values.get("mode") != "auto":
            return
        chosen = [where[k] for k in ("placement", "replicate_rows") if k in given]
        if chosen:
            raise _error(f"--mode auto chooses --placement and --replicate-rows: drop "
                         f"{' and '.join(chosen)} (or pick a mode)")
        for k in ("placement", "replicate_rows"):  # (defaults, then auto's choice)
            values.pop(k, None)
            where.pop(k, None)

    def validate(self, finite_data: bool = False) -> None:
        """Cross-field rules (``finite_data``: a Python dataset with ``n_rows`` is trained on,
        which ``--epochs`` counts as it counts ``--data``)."""
        if self.init_from is not None and self.resume is not None:
            raise _error("--init-from starts a new run from a checkpoint, --resume goes on "
                         "with its run: give one")
        if self.epochs is not None and self.data is None and not finite_data:
            raise _error("--epochs needs --data; the synthetic stream is endless: use --steps")
        for key, other, off in self.NEEDS[1:]:
            if getattr(self, other) != off and getattr(self, key) is None:
                raise _error(f"{option_flag(other)} needs {option_flag(key)}")
        if self.lr is None and self.sparse_optimizer not in SPARSE_LR:
            raise _error(f"--sparse-optimizer {self.sparse_optimizer} has no default rate "
                         "(optim.SPARSE_LR): give --lr")
        if why := zero_in(self.dtype, self.eps):  # (the kernels' eps is in --dtype)
            raise _error(f"--eps {self.eps:g} {why}")
        if why := refusal(self.mode, self.placement, self.servers, self.replicate_rows,
                          self.consistency, self.cache_rows, self.device):
            raise _error(why)

    def rates(self) -> dict:
        """The rows' (``lr``) and dense parameters' (``dense_lr``) rates before a schedule's
        factor: given, or the defaults (``SPARSE_LR``, a model's ``row_rates``, ``DENSE_LR``)."""
        rows = MODELS[self.model].row_rates.get(self.sparse_optimizer,
                                                SPARSE_LR.get(self.sparse_optimizer))
        dense = DENSE_LR[self.dense_optimizer] if self.dense_lr is None else self.dense_lr
        return {"lr": rows if self.lr is None else self.lr, "dense_lr": dense}

    sparse_lr = property(lambda self: self.rates()["lr"])
    dense_rate = property(lambda self: self.rates()["dense_lr"])

    def stateless(self) -> TrainConfig:
        """This config with optimizers that keep no state (plain SGD, no L2): what scoring
        builds (``train.setup(score=True)``) and sizes (``preflight``)."""
        return dataclasses.replace(self, sparse_optimizer="sgd", dense_optimizer="sgd", l2=0.0)
