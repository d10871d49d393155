"""The dense gradient's Allreduce, started in buckets while backward still runs."""

from __future__ import annotations

from mpi4py import MPI

from ..errors import ConfigError
from ..layers import ParamSpace


class GradBuckets:
    """Starts the dense gradient's Allreduce in buckets while backward still runs.

    Parameters sit in ``flat_grad`` in registration order and backward mostly finishes them
    in reverse, so a *suffix* of the buffer becomes final first. ``ready(names)`` (the
    ParamSpace callback) grows the final suffix; once it holds ``min_bytes`` not yet sent,
    that span's Iallreduce starts (in place). ``finish()`` starts whatever is left, in one
    last bucket, and returns every request of the step. Each element is reduced exactly once
    whatever order layers finish in; the buckets only decide how early. Every worker starts
    the same buckets in the same order (same model, same backward).

    ``deferred`` (GPU workers): the callback fires when backward's kernels are *launched*,
    not finished, and an MPI call on the buffer would need a host wait for the stream in the
    middle of backward. So the buckets are cut exactly as here but not started: ``finish()``
    returns their spans (slices of ``flat_grad``, in start order), and the caller starts
    them after the step's one stream synchronisation (``modes.step``).
    """

    def __init__(self, params: ParamSpace, start, min_bytes: int, deferred: bool = False):
        self.params, self.start, self.min_bytes = params, start, min_bytes
        self.deferred = deferred
        self.spans = sorted((params.offset(n), n) for n in params.names)  # (first element, name)
        self.itemsize = params.flat_grad.dtype.itemsize
        self._reset()

    def _reset(self) -> None:
        self.done: set[str] = set()
        self.k = len(self.spans)     # spans[k:] are final
        self.sent = self.params.size     # flat_grad[sent:] has been started
        self.reqs = []

    def ready(self, names) -> None:
        again = self.done.intersection(names)
        if again:  # the first report's span may be on the wire already: no silent mix-up
            raise ConfigError(f"parameters {sorted(again)} were reported final twice in one "
                              "backward pass (a layer applied twice per step?): train with "
                              "--bucket-mb 0 (bucket_mb=0 from Python)")
        self.done.update(names)
        while self.k > 0 and self.spans[self.k - 1][1] in self.done:
            self.k -= 1
        lo = self.spans[self.k][0] if self.k < len(self.spans) else self.params.size
        if (self.sent - lo) * self.itemsize >= self.min_bytes:
            self._send(lo)
        if self.reqs and not self.deferred:  # drive the started buckets (MPI progresses)
            MPI.Request.Testall([getattr(r, "req", r) for r in self.reqs])

    def _send(self, lo: int) -> None:
        # Wire: Iallreduce(SUM) of flat_grad[lo:sent] over the workers, in place (deferred:
        # none here; the span is started after the step's stream sync).
        self.reqs.append(slice(lo, self.sent) if self.deferred
                         else self.start(self.params.flat_grad[lo:self.sent]))
        self.sent = lo

    def finish(self) -> list:
        """Start the last bucket -> every request of the step (deferred: every span)."""
        if self.sent > 0:
            self._send(0)
        reqs = self.reqs
        self._reset()
        return reqs
