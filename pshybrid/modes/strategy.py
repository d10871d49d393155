"""The two strategy interfaces ``Mode`` drives (``modes.step``), declared: a sparse strategy
(``modes.sparse``: ``ServerSparse``, ``ReplicatedSparse``) and a dense one (``modes.dense``:
``AllreduceDense``, ``ServerDense``; ``pshybrid.torch``'s ``TorchDense``). A new strategy is
a class with these members, named in ``SPARSE`` / ``DENSE`` and in a catalogue entry
(``registry.MODES``), or a dense class handed to ``build_mode(..., dense=)``.

``live``: its pushes write weights others may still read (they wait for the step's sync
point); ``server_step``: the servers run a step for it. ``Mode.update`` reads these two
flags only. Checked structurally (``isinstance`` against the runtime-checkable protocols,
in the tests); nothing is inherited.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Strategy(Protocol):
    """What both kinds offer: tables on the store, the flags, state and counters."""

    live: bool
    server_step: bool

    def tables(self) -> list: ...               # TableSpecs it keeps on the servers' store
    def attach(self, store) -> None: ...        # the store (None when no table needs one)
    def close(self) -> None: ...
    def traffic(self) -> dict: ...              # bytes moved, by kind


@runtime_checkable
class SparseStrategy(Strategy, Protocol):
    """Where the embedding rows live and how their gradients move (workers and servers)."""

    prepare_uses_mpi: bool

    def ready(self) -> None: ...
    def begin(self, step: int) -> None: ...                     # before forward
    def prepare(self, ids): ...                                 # (B, F) int64 -> Batch
    def lookup(self, batch): ...                                # -> (B, F, E)
    def unique_rows(self, batch, out=None): ...                 # GPU: (U, E) host rows
    def stage(self, batch, demb) -> None: ...                   # GPU: queue D2H copies
    def start(self, batch, demb, step: int) -> None: ...
    def finish(self, batch, demb, step: int) -> None: ...
    def grads_for(self, server: int): ...                       # server s's step message
    def server_apply(self, parts, step: int) -> None: ...
    def set_rule(self, **changes) -> None: ...
    def before_checkpoint(self) -> None: ...
    def state(self): ...                                        # (ids (n,) | range, {slot: (n, E)})
    def load_rows(self, ids, values: dict) -> None: ...
    def owns(self, ids): ...
    def full_table(self): ...


@runtime_checkable
class DenseStrategy(Strategy, Protocol):
    """Where the dense weights live and how their gradients move. Built as
    ``cls(ctx, opt, bucket_bytes)``."""

    def begin(self, step: int) -> None: ...                     # before forward
    def stage(self, step: int) -> None: ...
    def start(self, step: int) -> None: ...
    def sync(self, step: int) -> bool: ...                      # True: a sync point was met
    def finish(self, step: int) -> None: ...
    def server_apply(self, step: int) -> None: ...
    def weights(self): ...                                      # (P,) host
    def state_full(self): ...                                   # (flat (P,), {slot: (P,)})
    def load(self, flat, state: dict) -> None: ...


def delegate(wrapper, inner, protocol) -> None:
    """Bind onto ``wrapper`` the methods of ``protocol`` its class does not define, taken from
    ``inner`` (the strategy it wraps), once: a wrapper that offered them only through
    ``__getattr__`` failed ``isinstance(wrapper, protocol)`` from Python 3.12 on, whose check
    reads attributes statically (every --replicate-rows run stopped on the assert in
    ``Mode``), and the step's calls skip a lookup each."""
    for cls in protocol.__mro__:
        if cls.__module__ == __name__:
            for name, member in vars(cls).items():
                if callable(member) and not name.startswith("_") and not hasattr(type(wrapper),
                                                                                 name):
                    setattr(wrapper, name, getattr(inner, name))
