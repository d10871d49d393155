"""``--tensorboard DIR``: the scalars of the ``--metrics`` records as TensorBoard event files
(``tensorboard --logdir DIR``), written by the reporting rank beside (or instead of) the
JSON lines. Needs tensorboardX (the ``tensorboard`` extra: a small pure-Python package).

Tags, each at the record's step: ``train/loss``, ``train/samples_per_s``, ``train/lr``,
``time/<phase>_ms_per_step`` (worker 0's per-phase time over the steps since the previous
record, or since the run's start), ``eval/auc``, ``eval/logloss``.
"""

from __future__ import annotations

import os
import time

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
    --metrics record (step, evaluation or summary) and flushes it, ``close()`` closes it.
    Written on the calling thread (tensorboardX's ``EventsWriter``): a write that fails
    (a full disk) raises ``OSError`` here. (tensorboardX's ``SummaryWriter`` writes on a
    thread of its own, which such an error ends; the training thread then blocked on the
    writer's full queue, deaf to SIGTERM.)"""

    def __init__(self, logdir: str):
        check()
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        self._event, self._summary = Event, scalar
        os.makedirs(logdir, exist_ok=True)
        self.events = EventsWriter(os.path.join(logdir, "events"),  # (a file of its own:
                                   f".{os.getpid()}")  # another run's in that second: its)
        self._last: tuple[int, dict] | None = None  # (step, cumulative phase seconds)

    def _scalar(self, tag: str, value: float, step: int) -> None:
        self.events.write_event(self._event(summary=self._summary(tag, value), step=step,
                                            wall_time=time.time()))

    def begin(self, step: int) -> None:
        """The run starts after ``step`` (0, or a resume's) with its phase timers at 0: the
        first record's ``time/`` scalars are its steps' since then."""
        self._last = (step, {})

    def add(self, rec: dict) -> None:
        if rec.get("summary"):
            return
        step, add = rec["step"], self._scalar
        if rec.get("eval"):
            add("eval/auc", rec["auc"], step)
            add("eval/logloss", rec["logloss"], step)
        else:
            add("train/loss", rec["loss"], step)
            add("train/samples_per_s", rec["samples_per_s"], step)
            if rec.get("lr") is not None:
                add("train/lr", rec["lr"], step)
            seconds = rec.get("seconds") or {}
            if self._last is not None and step > self._last[0]:
                done, before = step - self._last[0], self._last[1]
                for phase, s in seconds.items():
                    add(f"time/{phase}_ms_per_step",
                        1e3 * (s - before.get(phase, 0.0)) / done, step)
            self._last = (step, dict(seconds))
        self.events.flush()

    def close(self) -> None:
        self.events.close()
