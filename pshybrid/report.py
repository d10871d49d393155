"""What a training run prints and writes: progress lines, evaluations, ``--metrics`` JSON
lines and the final summary (built from every rank's timers and traffic counters).

A ``--metrics`` file starts with a config record (``config_record``); a run given an
existing ``--metrics`` file of pshybrid (a resume, a requeue) appends to it, starting with
its own config record, so one file holds the whole history across stops and resumes.
A write that fails (a full disk) is reported once; training goes on without metrics and
the run's exit status is 1 (``Reporter.failed``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time

import numpy as np

from . import __version__, dirlock, kernels, limits
from .batches import global_batch
from .config import TrainConfig, option_flag, shown
from .errors import ConfigError
from .models import MODELS
from .optim import SLOTS
from .registry import MODES, cache_serves, is_synchronous, parse_consistency
from .summary import reads_note
from .tboard import TensorBoard
from .threads import rank_server_threads

# --progress auto: a rank whose parent is one of these proxies (or a launcher itself) prints a
# bar when the launcher a generation or two up has a terminal as its stdout.
PROXIES = ("hydra_pmi_proxy", "orted", "prted")
LAUNCHERS = ("mpiexec", "mpirun", "orterun", "prterun")  # and NAME.suffix: mpiexec.openmpi
# The done line names the slowest worker where its own work (``timers.OWN_WORK``) is this
# many times the other workers' median, by at least this share of the run's seconds and
# these seconds (a short run's tenths of a second on a busy machine: not a slow node)
SLOW_RATIO, SLOW_SHARE, SLOW_MIN_S = 1.25, 0.05, 1.0


def _launcher(name: str) -> bool:
    """A launcher's command name, also under a distribution's alternatives (``mpiexec.hydra``,
    ``mpiexec.openmpi``, ``mpirun.mpich``)."""
    return name.split(".", 1)[0] in LAUNCHERS


def _proc(pid: int, root: str) -> tuple[str, int]:
    """(command name, parent pid) of process ``pid`` from ``root``/PID/stat."""
    with open(f"{root}/{pid}/stat") as fh:
        stat = fh.read()
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    return name, int(stat[stat.rindex(")") + 2:].split()[1])


def _on_terminal(pid: int, root: str) -> bool:
    """Is the stdout of process ``pid`` a terminal (``/dev/pts/N``, ``/dev/ttyX``)?"""
    try:
        target = os.readlink(f"{root}/{pid}/fd/1")
    except OSError:
        return False
    return re.fullmatch(r"/dev/(pts/[0-9]+|tty\w*|console)", target) is not None


def interactive(out, environ=None, root: str = "/proc") -> bool:
    """``--progress auto``: is ``out`` shown on an interactive terminal?

    Yes when ``out`` is a terminal itself (a plain process, ``srun --pty``) -- except under
    Open MPI (``OMPI_COMM_WORLD_SIZE`` set), whose ranks always get a pseudo-terminal.
    Otherwise, for a rank's stdout only: MPICH's and Open MPI's ranks write into a pipe that
    their parent (``PROXIES``, or the launcher) forwards to the launcher's own stdout, and
    nothing they pass tells whether that is a terminal (no tty, ``TERM`` inherited by batch
    jobs too), so look: yes when the parent is a proxy or launcher and a ``LAUNCHERS``
    process within two more generations has a terminal as its stdout. Anything else (a
    batch log, a pipe, a file, ``srun`` without ``--pty``, a rank on another node than the
    launcher): no.
    """
    environ = os.environ if environ is None else environ
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO, a closed stream
        return False
    if os.isatty(fd) and "OMPI_COMM_WORLD_SIZE" not in environ:
        return True
    if fd != 1:
        return False
    try:
        name, pid = _proc(os.getpid(), root)
        name, ppid = _proc(pid, root)
        if name not in PROXIES and not _launcher(name):
            return False
        for _ in range(3):
            if _launcher(name):
                return _on_terminal(pid, root)
            pid = ppid
            name, ppid = _proc(pid, root)
    except (OSError, ValueError, IndexError):  # no /proc, a process gone
        return False
    return False


def config_record(cfg, command: str, start: int, workers: int, servers: int) -> dict:
    """The first record of a --metrics file, and of each run appending to it."""
    from .config import to_dict

    return {"config": to_dict(cfg), "rates": cfg.rates(), "pshybrid": __version__,
            "command": command, "start_step": start, "workers": workers, "servers": servers}


def in_use(path: str) -> str:
    return (f"--metrics {path} is being written by another run (it holds a lock on it): "
            "choose another name")


def metrics_problem(path: str) -> str | None:
    """Why the existing file ``path`` is not a --metrics file a run may append to (None: it
    is one, or it is empty): its first line must be a config record of pshybrid."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
    except OSError as e:
        return f"--metrics {path}: cannot read: {e.strerror or e}"
    if dirlock.flock_held(path):
        return in_use(path)
    if not first.strip():
        return None
    try:
        rec = json.loads(first)
    except ValueError:
        rec = None
    if isinstance(rec, dict) and "pshybrid" in rec and isinstance(rec.get("config"), dict):
        return None
    return (f"--metrics {path} exists and is not a --metrics file of pshybrid (its first line "
            "is not a config record): not appended to, not replaced; choose another name")


def open_metrics(path: str):
    """``path`` opened for appending (created if missing), never through a link, and held
    (an exclusive ``flock``, where the filesystem has locks) while the run writes it: a
    second job given the same file is refused (``dirlock.flock_held``; its lines and this
    run's interleaved, every step twice); a last line cut short (a job killed while writing
    it) is ended first, so it stays alone."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    if not dirlock.hold(fd):
        os.close(fd)
        raise ConfigError(in_use(path))
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")
    return os.fdopen(fd, "a")


class Reporter:
    """The rank that prints progress and writes --metrics (worker 0). ``cfg.progress``:
    ``bar`` (one line redrawn with ``\\r``), ``lines`` (one per log), ``none``; ``auto``:
    ``bar`` where ``interactive(out)``, else ``lines``."""

    def __init__(self, cfg, out, W: int, total_steps: int, lr_at=None,
                 steps_per_epoch: int | None = None):
        self.cfg, self.out, self.W, self.total_steps = cfg, out, W, total_steps
        self.lr_at, self.steps_per_epoch = lr_at, steps_per_epoch  # for ``stamp``
        progress = getattr(cfg, "progress", "auto")
        if progress == "auto":
            progress = "bar" if interactive(out) else "lines"
        self.progress = progress
        self.bar = progress == "bar"  # a bar line may be open: end it before other output
        self.t0 = time.perf_counter()  # the progress line's elapsed time counts from here
        self.metrics = open_metrics(cfg.metrics) if cfg.metrics else None
        self.failed: str | None = None  # why --metrics stopped being written
        tb = getattr(cfg, "tensorboard", None)
        self.tboard = TensorBoard(tb) if tb else None  # --tensorboard: the same scalars

    def step(self, rec: dict) -> None:
        total = self.total_steps
        per_s = rec["samples_per_s"] / global_batch(self.cfg, self.W)  # steps per second
        eta = (total - rec["step"]) / per_s if per_s > 0 else float("inf")
        msg = (f"step {rec['step']}/{total}  loss {rec['loss']:.4f}  "
               f"{rec['samples_per_s']:,.0f} samples/s  elapsed "
               f"{clock(time.perf_counter() - self.t0)}  ETA {clock(eta)}")
        if self.bar:
            done = int(30 * rec["step"] / max(total, 1))
            self.out.write(f"\r[{'#' * done}{'.' * (30 - done)}] {msg}   ")
        elif self.progress == "lines":
            self.out.write(msg + "\n")
        self.out.flush()
        self._write(rec)

    def say(self, line: str) -> None:
        """A line of its own (an open bar's line ended first)."""
        self.out.write(("\n" if self.bar else "") + line + "\n")
        self.out.flush()

    def evaluation(self, rec: dict) -> None:
        a, why = rec["auc"], "NaN logits" if math.isnan(rec["logloss"]) else "one class"
        shown = f"{a:.4f}" if math.isfinite(a) else f"n/a ({why})"  # (written null)
        worse = (f" (above the base rate's {b:.4f}: worse than predicting the mean label)"
                 if math.isfinite(a) and rec["logloss"] > (b := rec["base_rate_logloss"]) else "")
        self.say(f"eval at step {rec['step']}: auc {shown}  logloss "
                 f"{rec['logloss']:.4f}{worse}  ({counted(rec['rows'], 'row')})")
        self._write(rec)

    def stamp(self, rec: dict, step: int) -> None:
        """Add ``time`` (unix seconds), ``epoch`` (passes over --data done after ``step``;
        None on the endless synthetic stream) and ``lr`` (the sparse learning rate of
        ``step``, the schedule applied) to ``rec``."""
        rec["time"] = time.time()
        rec["epoch"] = step / self.steps_per_epoch if self.steps_per_epoch else None
        rec["lr"] = self.lr_at(step) if self.lr_at is not None else None

    def loaded(self, path: str, step: int, how: str, size: int, seconds: float) -> None:
        """The checkpoint ``path`` (at ``step``, of ``size`` bytes) loaded in ``seconds``: to
        score (``how`` "eval"), to go on ("resume"), or to start from ("init": --init-from)."""
        took = f"{limits.gib(size)} in {seconds:.1f} s"
        self.out.write(f"loaded {path} (step {step}; {took})\n" if how == "eval" else
                       f"resumed from {path} at step {step} ({took})\n" if how == "resume" else
                       f"started from {path} (its step {step}) at step 0 ({took})\n")

    def header(self, command: str, start: int, workers: int, servers: int) -> None:
        """Write the run's config record (the first line of the run in --metrics)."""
        rec = config_record(self.cfg, command, start, workers, servers)
        rec["time"] = time.time()
        self._line(rec)
        if self.tboard:  # the first record's phase times: since this run's start
            self.tboard.begin(start)

    def _write(self, rec: dict) -> None:
        self.stamp(rec, rec["steps"] if rec.get("summary") else rec["step"])
        if self.tboard:  # the records' scalars (the config record above has none)
            try:
                self.tboard.add(rec)
            except OSError as e:  # as --metrics: say so once, train on without events
                self._stopped(f"--tensorboard {self.cfg.tensorboard}: {e.strerror or e}",
                              "events")
                with contextlib.suppress(OSError):
                    self.tboard.close()
                self.tboard = None
        self._line(rec)

    def _line(self, rec: dict) -> None:
        if not self.metrics:
            return
        try:
            self.metrics.write(json.dumps(_finite(rec), allow_nan=False) + "\n")
            self.metrics.flush()
        except OSError as e:  # a full disk: say so once, train on without metrics
            self._stopped(f"--metrics {self.cfg.metrics}: {e.strerror or e}", "metrics")
            self._close_metrics()

    def _stopped(self, why: str, what: str) -> None:
        self.failed = why
        sys.stderr.write(f"pshybrid: warning: {why}: no more {what} are written; training "
                         "goes on (exit status 1 at the end)\n")
        sys.stderr.flush()

    def close(self, summary: dict) -> None:
        self._write(summary)
        split = "  ".join(f"{k} {v:.0%}" for k, v in summary["phase_fraction"].items()
                          if v >= 0.005 and summary["steps_run"])
        if summary["servers"] and summary["steps_run"]:  # what the workers' wait is made of
            per = 1e3 / summary["steps_run"]
            split += (f"  |  wait {summary['phase_seconds']['wait'] * per:.2f} ms/step, "
                      f"servers' apply {summary['server_apply_seconds'] * per:.2f} ms/step")
        self.say(f"done: {summary['mode']} {summary['model']}  {summary['steps']} steps  "
                 f"{summary['samples_per_s']:,.0f} samples/s  final loss "
                 f"{_num(summary['final_loss'])} (base-rate logloss "
                 f"{_num(summary['base_rate_logloss'])})  workers {self.W} servers "
                 f"{summary['servers']}" + (f"  |  {split}" if split else "")
                 + reads_note(summary) + _slowest(summary))
        if (kept := self.best_checkpoint()) is not None:
            self.out.write(f"best evaluated checkpoint: {kept}\n")
        self.out.flush()
        self.close_file()

    def best_checkpoint(self) -> str | None:
        """The run's checkpoint of the best evaluation AUC (``checkpoint_files.best``) and
        its AUC, where its --checkpoint-dir holds an evaluated one."""
        from .checkpoint_files import best, list_steps

        root = self.cfg.checkpoint_dir
        try:
            kept = best(list_steps(root)) if root and os.path.isdir(root) else None
        except OSError:  # (changed meanwhile: nothing to say)
            return None
        return kept and f"{os.path.join(root, kept[0])} (auc {kept[1]:.4f})"

    def close_file(self) -> str | None:
        """Close the metrics file and the TensorBoard events (also when training fails);
        returns ``failed``: why an output stopped being written (None: it did not)."""
        self._close_metrics()
        if self.tboard:
            tb, self.tboard = self.tboard, None
            try:
                tb.close()
            except OSError as e:
                self._stopped(f"--tensorboard {self.cfg.tensorboard}: {e.strerror or e}",
                              "events")
        return self.failed

    def _close_metrics(self) -> None:
        if self.metrics:
            f, self.metrics = self.metrics, None
            try:
                f.close()
            except OSError:  # the buffered line of a failed write: dropped with the file
                with contextlib.suppress(OSError, ValueError):
                    os.close(f.fileno())


def _slowest(summary: dict) -> str:
    """The done line's note of a worker the others waited for, if one stands out."""
    slow = summary["slowest_worker"]
    own, mid = slow["own_seconds"], slow["median_own_seconds"]
    if summary["workers"] < 2 or own < SLOW_RATIO * mid or own - mid < max(
            SLOW_SHARE * summary["seconds"], SLOW_MIN_S):
        return ""
    return (f"  |  slowest worker {slow['worker']} (rank {slow['rank']}): its own work "
            f"{own:.1f} s, {own / max(mid, 1e-12):.1f}x the others' median: they "
            "wait for it")


def clock(seconds: float) -> str:
    """``h:mm:ss`` (``--:--:--`` when not finite)."""
    if not math.isfinite(seconds):
        return "--:--:--"
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def span(ranks: list[int]) -> str:
    """World ranks as text: ``0-3``, ``0,2,5``."""
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def counted(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _data_notes(cfg, rows: int, F: int, n_rows: int | None, G: int,
                ids: int | None) -> list[str]:
    """The plan's lines on the training file: tables larger than its ids (``ids``: their
    count, multi-hot values included; None: a row's ids are its fields); an epoch that
    drops a sizeable share of its rows (the last partial global batch)."""
    out = []
    if n_rows is not None and rows > (n_rows * F if ids is None else ids):
        held = (f"{counted(n_rows, 'row')} x {F} fields = {n_rows * F:,} ids" if ids is None
                else f"{counted(n_rows, 'row')} with {ids:,} ids")
        out.append(f"  warning: the tables have {counted(rows, 'row')}, the data {held}: most "
                   "rows can never train (prep sizes them: criteo|csv --buckets or "
                   "--min-count K, synthetic --max-cardinality)")
    dropped = n_rows % G if n_rows is not None and n_rows >= G else 0
    if dropped and dropped >= n_rows // 100:    # 1% or more of the rows each epoch
        which = ("other rows each epoch (--shuffle)" if cfg.shuffle else
                 "the same last rows every epoch (--no-shuffle)")
        out.append(f"  note: an epoch trains {n_rows - dropped:,} of the {n_rows:,} rows: the "
                   f"last partial global batch ({dropped:,} rows of {G:,}) is dropped, "
                   f"{which}")
    return out


def _idle_notes(cfg, schema, steps: int, n_rows: int | None, auto: bool) -> list[str]:
    """The plan's notes on options set off their defaults that this run never reads (a config
    file kept across runs, an option meant for another mode or model, a companion option left
    out), and on a warm-up longer than the run. ``auto``: ``--mode auto`` chose ``cfg.mode``."""
    spec, kinds = MODES[cfg.mode], (cfg.sparse_optimizer, cfg.dense_optimizer)
    rules = (("steps", cfg.epochs, "--epochs decides the steps"),
             ("auto_trial_steps", not auto, "trials run under --mode auto only"),
             ("cross_layers", not MODELS[cfg.model].cross_layers,
              f"--model {cfg.model} has no cross layers"),
             ("bottom_mlp", not MODELS[cfg.model].bottom_mlp,
              f"--model {cfg.model} has no bottom MLP"),
             ("cuda_aware", cfg.device != "cuda", "it is read with --device cuda only"),
             ("cuda_graphs", cfg.device != "cuda", "it is read with --device cuda only"),
             ("bucket_mb", not spec.dense_allreduce,
              f"--mode {cfg.mode} Allreduces no dense gradient"),
             ("shared_memory", not spec.needs_servers, f"--mode {cfg.mode} has no server"),
             ("pooling", not schema.multi_hot, "the data has no multi-hot field"),
             ("shuffle", n_rows is None, "the data is a stream, not a file of rows"),
             *((k, "adam" not in kinds, "neither optimizer is adam") for k in ("beta1", "beta2")),
             ("eps", set(kinds) <= {"sgd"}, "both optimizers are sgd"))
    out, fields = [], TrainConfig.__dataclass_fields__
    for key, idle, why in rules:
        value = getattr(cfg, key)
        if idle and value != fields[key].default:
            given = (option_flag(key) if value else f"--no-{option_flag(key)[2:]}"
                     ) if isinstance(value, bool) else f"{option_flag(key)} {shown(value)}"
            out.append(f"  note: {given} does nothing in this run: {why}")
    if cfg.warmup_steps > steps > 0:
        out.append(f"  note: --warmup-steps {cfg.warmup_steps} is more than the run's "
                   f"{counted(steps, 'step')}: the learning rate never reaches its full value")
    return out


def _hot_notes(cfg, rows: int) -> list[str]:
    """The plan's notes on a hot-row cache or replicated set larger than the tables, on a
    cache that can never serve (or serves once) under the consistency given, and on a bound
    beyond ssp:1 (or asp) without a cache, which only a cache uses."""
    out = []
    for option, n in (("--cache-rows", cfg.cache_rows), ("--replicate-rows", cfg.replicate_rows)):
        if n > rows:
            out.append(f"  note: {option} {n:,} is more than the tables' {rows:,} rows: every "
                       "worker allocates and keeps up all of them; a few % of the rows (the "
                       "hottest) is what pays")
    bound = parse_consistency(cfg.consistency).bound
    if cfg.cache_rows and bound in (0, 1):
        out.append(f"  note: --cache-rows {cfg.cache_rows} under --consistency "
                   f"{cfg.consistency}: " + (
                       "no cached row is ever served (a cache serves under ssp:K with K >= "
                       "2, or asp); it only costs its upkeep" if not cache_serves(
                           cfg.consistency) else
                       "a cached row serves only the step after the start or a checkpoint "
                       "(a cache serves every step under ssp:K with K >= 2, or asp)"))
    if not cfg.cache_rows and (bound is None or bound >= 2):
        out.append(f"  note: --consistency {cfg.consistency} without --cache-rows: the run is "
                   "ssp:1's (every read pulled one step ahead; the rest of the bound is the "
                   "cache's)")
    return out


def banner(cfg, topo, schema, steps: int, n_rows: int | None = None,
           compression: str | None = None, eval_rows: int = 0, auto: bool = False,
           ids: int | None = None) -> str:
    """What the run is about to do, printed by worker 0 before the tables are built: who is
    a worker and who serves, the global batch, the tables' rows and bytes (per server),
    the dense parameters, a checkpoint's size, the sparse optimizer's threads (sized on
    worker 0 as for a server on server 0's node: every rank sizes its own by the same rule);
    a warning when the tables have more rows than the data has ids (``ids``: their count,
    multi-hot values included; most rows would never train),
    a note when the training data is compressed (``compression``: its filter), when a
    hot-row cache can never serve under the consistency given, when an option does nothing
    (``_idle_notes``; ``auto``: --mode auto chose the mode) and when numba compiles.
    ``eval_rows``: the --eval-data file's rows, in the memory line as in the check."""
    W, S, s = topo.n_workers, topo.n_servers, np.dtype(cfg.dtype).itemsize
    P, E = limits.model_size(cfg, schema)
    rows, F = int(sum(schema.cardinalities)), len(schema.cardinalities)
    slots = len(SLOTS[cfg.sparse_optimizer])
    table = rows * E * s * (1 + slots)
    ranks = lambda rs: f"rank{'s' if len(rs) > 1 else ''} {span(rs)}"  # noqa: E731
    sharded = S and MODES[cfg.mode].sparse_on_servers    # (else a copy on every worker)
    if topo.colocated:
        who = f"{counted(W, 'worker')}, each owning a shard"
    elif S:
        who = (f"{counted(W, 'worker')} ({ranks(topo.worker_ranks)}), {counted(S, 'server')} "
               f"({ranks(topo.server_ranks)})")
    else:
        who = f"{counted(W, 'worker')}, no server"
    where = (f"{limits.gib(-(-table // S))} per {'rank' if topo.colocated else 'server'}"
             if sharded else "all of it on every worker")
    reads = ("" if is_synchronous(cfg.consistency) and not cfg.cache_rows else
             f"; --consistency {cfg.consistency}"
             + (f", a {cfg.cache_rows:,}-row cache a worker" if cfg.cache_rows else ""))
    lines = [f"plan: {cfg.mode} {cfg.model} on {counted(topo.size, 'rank')}, "
             f"{counted(topo.n_nodes, 'node')}: {who}",
             f"  global batch {global_batch(cfg, W):,} = {counted(W, 'worker')} x --batch-size "
             f"{cfg.batch_size}; {counted(steps, 'step')}{reads}",
             f"  tables: {counted(F, 'field')}, {counted(rows, 'row')} x {E} {cfg.dtype} + "
             f"{slots} {cfg.sparse_optimizer} state: {limits.gib(table)}, {where}",
             f"  dense: {counted(P, 'parameter')}; a checkpoint holds about "
             f"{limits.gib(limits.checkpoint_bytes(cfg, schema))}"]
    lines.append(limits.memory_line(cfg, schema, topo, eval_rows))
    here = topo.dedicated_servers_on(topo.node_of_rank[topo.server_ranks[0]]) if S else 0
    T, rule = rank_server_threads(cfg.server_threads, here)  # (as on server 0's node)
    holder = ("each rank" if topo.colocated else "each server" if sharded else "each worker")
    lines.append(f"  sparse optimizer: {counted(T, 'thread')} on {holder}'s rows ({rule})")
    lines += [f"  warning: {why}" for why in topo.shared_cores()]
    lines += _data_notes(cfg, rows, F, n_rows, global_batch(cfg, W), ids)
    lines += _idle_notes(cfg, schema, steps, n_rows, auto) + _hot_notes(cfg, rows)
    if compression:
        lines.append(f"  note: --data is {compression}-compressed: its reads cost 8x or more an "
                     "uncompressed file's CPU per batch (prep --compression none writes one)")
    if kernels.numba_cache_cold():
        lines.append("  first run in this environment: numba compiles the CPU kernels "
                     "(some seconds; cached for later runs)")
    return "\n".join(lines) + "\n"


def _finite(v):
    """``v`` with every NaN or infinity (an AUC of one class, a diverged loss) as None:
    strict JSON has no NaN (written as null)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"
