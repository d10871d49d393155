"""The ``eval``, ``predict`` and ``plot`` commands: their options and handlers (the work is
in ``scoring`` and ``plot``, imported when a command runs)."""

from __future__ import annotations

import os
import sys

from .stopping import ended_by_signals

CKPT_HELP = ("checkpoint directory (its 'latest'), a step-N directory, or DIR/best (the best "
             "evaluated)")


def add_scoring_commands(sub) -> None:
    """Add ``eval``, ``predict`` and ``plot`` to the ``pshybrid`` subparsers ``sub``."""
    ev = _scoring_parser(sub, "eval", "exact AUC and logloss of a checkpoint on a dataset "
                         "file (any number of ranks)", "Evaluate a checkpoint on a dataset "
                         "file: exact AUC and logloss, computed as training's --eval-data "
                         "evaluation. Runs on one process or under mpiexec -n N (every rank "
                         "scores 1/N of the rows). A file without labels (prep --unlabeled) "
                         "is refused: predict scores it.")
    ev.add_argument("--metrics", metavar="FILE", default=None,
                    help="also write the evaluation as one JSON line to FILE (after a "
                    "config record; an existing --metrics file is appended to)")
    ev.set_defaults(func=ended_by_signals(cmd_eval))
    pr = _scoring_parser(sub, "predict", "one score per row of a dataset file from a "
                         "checkpoint, to HDF5 (/score, /logit)", "Score every row of a "
                         "dataset file with a checkpoint's model; OUT.h5 gets /score (the "
                         "predicted click probability) and /logit, float64, one per row in "
                         "row order. Written atomically. DATA may be a file without labels "
                         "(prep --unlabeled), encoded as the training data was (its --buckets "
                         "or --vocabulary TRAIN.h5).")
    add_out(pr)
    pr.set_defaults(func=ended_by_signals(cmd_predict))
    pl = sub.add_parser("plot", help="loss, samples/s and AUC curves of --metrics files "
                        "(needs matplotlib)",
                        description="Draw --metrics files' training loss, samples/s and "
                        "evaluation AUC/logloss against the step; several runs are overlaid, "
                        "labelled by file name (needs matplotlib: pip install "
                        "'pshybrid[plot]').")
    pl.add_argument("runs", nargs="+", metavar="RUN.jsonl",
                    help="--metrics JSON-lines file(s) of training runs")
    pl.add_argument("out", help="image file (.png, .svg, .pdf; written atomically; refused "
                    "if it exists, unless --overwrite)")
    pl.add_argument("--overwrite", action="store_true", help="replace an existing image OUT "
                    "(never another kind of file)")
    pl.set_defaults(func=ended_by_signals(cmd_plot))


def add_out(p) -> None:
    """OUT and --overwrite of ``predict`` and ``export``."""
    p.add_argument("out", help="output .h5 file (refused if it exists, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT written "
                   "by the same command (never another file)")


def _scoring_parser(sub, name: str, help: str, description: str):
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("ckpt", help=CKPT_HELP)
    p.add_argument("data", help="dataset (HDF5, the checkpoint's fields): a file, a comma "
                   "list of files or a directory (its *.h5 files by name), as --data")
    return p


def cmd_eval(args) -> int:
    from mpi4py import MPI

    from .scoring import score

    res = score(args.ckpt, args.data, MPI.COMM_WORLD, metrics=args.metrics, stdout=sys.stdout)
    return 1 if res.metrics_failed else 0


def cmd_predict(args) -> int:
    from mpi4py import MPI

    from .scoring import score

    res = score(args.ckpt, args.data, MPI.COMM_WORLD, out=args.out, overwrite=args.overwrite)
    if MPI.COMM_WORLD.rank == 0:
        n = res.summary["rows"]
        print(f"predicted {n:,} row{'' if n == 1 else 's'} with step {res.summary['step']} "
              f"-> {args.out}")
    return 0


def cmd_plot(args) -> int:
    from .plot import plot

    n, e = plot(args.runs, args.out, args.overwrite)
    runs = f" of {len(args.runs)} runs" if len(args.runs) > 1 else ""
    fmt = "" if os.path.splitext(args.out)[1] else " (no extension: PNG)"
    print(f"plotted {n} step and {e} evaluation records{runs} -> {args.out}{fmt}")
    return 0
