"""The dense gradient's Allreduce, started in buckets while backward still runs."""

from __future__ import annotations

from mpi4py import MPI

from ..errors import ConfigError
from ..layers import ParamSpace


class GradBuckets:
    """Starts the dense gradient's Allreduce in buckets while backward still runs.

    Parameters sit in ``flat_grad`` in registration order and backward mostly finishes them
    in reverse, so a *suffix* of the buffer becomes final first. The buckets are cut once,
    from the end, at the first parameter boundary where each holds ``min_bytes``; the last
    (the buffer's start) holds the rest. ``ready(names)`` (the ParamSpace callback) grows
    the final suffix and starts, in order, each bucket it now covers (an Iallreduce, in
    place). ``finish()`` starts the buckets left, in order, and returns every request of the
    step. Each element is reduced exactly once whatever order layers finish in, and every
    worker starts the same buckets in the same order, also when their backward passes
    differ (a parameter one worker's batch leaves unused holds its bucket, and the later
    ones, until ``finish``): nonblocking collectives must match in order and size.

    ``deferred`` (GPU workers): the callback fires when backward's kernels are *launched*,
    not finished, and an MPI call on the buffer would need a host wait for the stream in the
    middle of backward. So the buckets are cut exactly as here but not started: ``finish()``
    returns their spans (slices of ``flat_grad``, in start order), and the caller starts
    them after the step's one stream synchronisation (``modes.step``).
    """

    def __init__(self, params: ParamSpace, start, min_bytes: int, deferred: bool = False):
        self.params, self.start = params, start
        self.deferred = deferred
        # (first element, name) in buffer order; a zero-element parameter shares its offset
        # with the next one, and stays before it (sorted by offset alone, stable)
        self.spans = sorted(((params.offset(n), n) for n in params.names), key=lambda s: s[0])
        itemsize = params.flat_grad.dtype.itemsize
        self.cuts = []  # (k, lo) in start order: a bucket is flat_grad[lo:the previous lo]
        end = params.size
        for k in range(len(self.spans) - 1, 0, -1):
            if (end - self.spans[k][0]) * itemsize >= min_bytes:
                end = self.spans[k][0]
                self.cuts.append((k, end))
        if end > 0:
            self.cuts.append((0, 0))
        self._reset()

    def _reset(self) -> None:
        self.done: set[str] = set()
        self.k = len(self.spans)     # spans[k:] are final
        self.next = 0                # cuts[next:] not started yet
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
        self._send_until(self.k)
        if self.reqs and not self.deferred:  # drive the started buckets (MPI progresses)
            self.complete()

    def complete(self) -> bool:
        """Whether every started bucket is complete (a test: it drives them, waits for none)."""
        return MPI.Request.Testall([getattr(r, "req", r) for r in self.reqs])

    def _send_until(self, k: int) -> None:
        """Start, in order, every bucket not yet started whose parameters are ``spans[k:]``'s."""
        while self.next < len(self.cuts) and self.cuts[self.next][0] >= k:
            lo = self.cuts[self.next][1]
            # Wire: Iallreduce(SUM) of flat_grad[lo:sent] over the workers, in place
            # (deferred: none here; the span is started after the step's stream sync).
            self.reqs.append(slice(lo, self.sent) if self.deferred
                             else self.start(self.params.flat_grad[lo:self.sent]))
            self.sent, self.next = lo, self.next + 1

    def finish(self) -> list:
        """Start the buckets left -> every request of the step (deferred: every span)."""
        self._send_until(0)
        reqs = self.reqs
        self._reset()
        return reqs
