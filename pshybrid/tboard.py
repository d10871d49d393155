"""``--tensorboard DIR``: the scalars of the ``--metrics`` records as TensorBoard event files
(``tensorboard --logdir DIR``), written by the reporting rank beside (or instead of) the
JSON lines. Needs tensorboardX (the ``tensorboard`` extra: a small pure-Python package).

Tags, each at the record's step: ``train/loss``, ``train/samples_per_s``, ``train/lr``,
``time/<phase>_ms_per_step`` (the workers' per-phase time over the steps since the previous
record), ``eval/auc``, ``eval/logloss``.
"""

from __future__ import annotations

from .errors import ConfigError

NEEDS = "--tensorboard needs tensorboardX: pip install 'pshybrid[tensorboard]'"


def check() -> None:
    """Raise ConfigError (``NEEDS``) when tensorboardX cannot be imported."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise ConfigError(NEEDS) from None


class TensorBoard:
    """One run's event file in ``logdir`` (created if missing); ``add(rec)`` takes each
    --metrics record (step, evaluation or summary), ``close()`` flushes it."""

    def __init__(self, logdir: str):
        check()
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=logdir)
        self._last: tuple[int, dict] | None = None  # (step, cumulative phase seconds)

    def add(self, rec: dict) -> None:
        if rec.get("summary"):
            return
        step, add = rec["step"], self.writer.add_scalar
        if rec.get("eval"):
            add("eval/auc", rec["auc"], step)
            add("eval/logloss", rec["logloss"], step)
            return
        add("train/loss", rec["loss"], step)
        add("train/samples_per_s", rec["samples_per_s"], step)
        if rec.get("lr") is not None:
            add("train/lr", rec["lr"], step)
        seconds = rec.get("seconds") or {}
        if self._last is not None and step > self._last[0]:
            done, before = step - self._last[0], self._last[1]
            for phase, s in seconds.items():
                add(f"time/{phase}_ms_per_step", 1e3 * (s - before.get(phase, 0.0)) / done,
                    step)
        self._last = (step, dict(seconds))

    def close(self) -> None:
        self.writer.close()
