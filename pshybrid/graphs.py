"""A GPU worker's step on the device: one copy in, one CUDA graph, outputs left in place.

``DeviceStep`` runs on the device everything a training step computes between the rows
pulled for a batch and the gradients that go on the wire:

    inputs (host)   labels (B,), dense features (B, Fd), the batch's distinct rows (U, E)
                    and the inverse index (B*F,) (``unique[inverse] == ids``)
    body (device)   expand the rows (gather kernel), the model's forward, the loss and its
                    gradient (one fused kernel), zero the dense gradients, backward (they
                    land in ``ParamSpace.flat_grad``), sum the embedding gradients per
                    distinct id (scatter-add into a buffer cleared in the body), the loss
                    and label sums into a (2,) float64 pair
    outputs         the (U, E) sums, the pair, ``flat_grad``: read after the step's one
                    host wait (``modes.step``: the D2H copies are queued there)

The four inputs are packed into one pinned host buffer (the rows pulled straight into their
place there: ``rows_out``) and go to the device in ONE asynchronous copy, into a static
device buffer of capacity C >= U distinct rows (``capacity``: powers of two from
``MIN_CAPACITY``, at most B*F). Where the model allows it
(``row_padding``: WDL, DeepFM, DCN, DCN-V2), the rows are padded with zeros to a whole number of
16-byte vectors on the device (dim 16 + the wide weight: 17 -> 20 float32), so the gather
and scatter-add kernels take their vector path; the body copies the (C, E) sums out of the
padded ones. Each capacity's body is
captured once as a CUDA graph (``cupy.cuda.Stream.begin_capture``) and then launched: one
launch replaces the body's dozens. The first step of a capacity runs the body eagerly (it
compiles CuPy's kernels and warms cuBLAS: nothing is built during a capture), the next one
captures it. The capture runs on the worker's own non-default stream (CUDA captures no
other), with the body's allocations from a memory pool of the graphs' own: a launch writes
only memory no array outside the graphs can be given. The body's host-side effects, the
dense gradient buckets' cuts (``ParamSpace.grads_ready``), are recorded at the capture and
replayed with each launch. ``graphs=False`` (``--cuda-graphs off``) runs the same body
eagerly every step: the oracle of the graphs (same buffers, same kernels). A capture that
fails turns the graphs off for the run; ``why_eager`` says why.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .backend import pinned_buffer, wait_event
from .layers import bce_with_logits

MIN_CAPACITY = 1024  # distinct rows of the smallest static buffer (and graph)
_ALIGN = 256         # bytes: each packed input starts on it (the kernels' vector loads)
_VECTOR = 16         # bytes: the kernels' vector loads and stores (cuda._width)


def padded_width(E: int, dtype) -> int:
    """E elements of ``dtype`` rounded up to a whole number of 16-byte vectors."""
    per = _VECTOR // np.dtype(dtype).itemsize
    return -(-E // per) * per


def capacity(U: int, most: int) -> int:
    """The static capacity for ``U`` distinct rows: the power of two >= U from
    ``MIN_CAPACITY`` on, at most ``most`` (B*F: no batch has more)."""
    c = MIN_CAPACITY
    while c < U:
        c *= 2
    return max(min(c, most), 1)


def _layout(parts) -> tuple[dict, int]:
    """[(name, shape, dtype)] -> ({name: (byte offset, shape, dtype)}, total bytes), each
    part aligned to ``_ALIGN``."""
    out, off = {}, 0
    for name, shape, dtype in parts:
        out[name] = (off, shape, np.dtype(dtype))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        off += -(-nbytes // _ALIGN) * _ALIGN
    return out, off


class _Slot:
    """The static device buffers of one capacity: inputs (views of one byte buffer),
    outputs, and the graph once captured."""

    def __init__(self, xp, layout: dict, nbytes: int, C: int, E: int, dtype):
        self.C, self.layout, self.raw = C, layout, xp.empty(nbytes, np.uint8)
        for name, (off, shape, dt) in layout.items():
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            setattr(self, name, self.raw[off:off + n].view(dt).reshape(shape))
        Ep = self.rows.shape[1]  # E, or padded
        self.sums = xp.empty((C, E), dtype)
        self.padded_sums = xp.empty((C, Ep), dtype) if Ep != E else self.sums
        self.pair = xp.zeros(2, np.float64)  # (loss sum, label sum) of the step
        self.graph, self.ready, self.runs = None, [], 0


class DeviceStep:
    """The device part of one GPU worker's training step (module docstring): ``run`` it
    with the step's host inputs. ``model`` and ``params`` on ``xp`` (cupy); ``B``, ``F``,
    ``E``, ``Fd``: batch rows, fields, the fused row's width, dense features; ``scale``: the
    loss gradient's factor (1 / the global batch)."""

    def __init__(self, xp, model, params, dtype, B: int, F: int, E: int, Fd: int,
                 scale: float, graphs: bool = True):
        self.xp, self.model, self.params = xp, model, params
        self.dtype, self.B, self.F, self.E, self.scale = np.dtype(dtype), B, F, E, scale
        self.Ep = padded_width(E, dtype) if getattr(model, "row_padding", False) else E
        self.Fd, self.graphs = Fd, graphs
        self.why_eager = None if graphs else "--cuda-graphs off"
        self.slots: dict[int, _Slot] = {}
        self.pinned, self.copied = None, None  # the host buffer, the event of its last copy
        self.pad_zeroed = (None, 0, 0)  # (pinned buffer, rows' offset, rows): their pad is 0
        self.pool = xp.cuda.MemoryPool() if graphs else None  # the graphs' allocations
        self.stream = self.previous = xp.cuda.get_current_stream()
        if self.stream.ptr in (0, 1):  # the legacy default stream: CUDA captures none
            xp.cuda.Device().synchronize()  # what set-up queued there is done
            self.stream = xp.cuda.Stream(non_blocking=True)
            self.stream.use()  # from now on every kernel and copy of this thread

    def close(self) -> None:
        """The run is over: its stream's work done, the thread's stream as before."""
        if self.stream is not self.previous:
            self.stream.synchronize()
            self.previous.use()

    def _slot(self, U: int) -> _Slot:
        """The slot of the capacity that holds ``U`` distinct rows (made on first use)."""
        C = capacity(U, self.B * self.F)
        slot = self.slots.get(C)
        if slot is None:
            B, dt = self.B, self.dtype
            layout, nbytes = _layout([("label", (B,), dt), ("dense", (B, self.Fd), dt),
                                      ("inverse", (B * self.F,), np.int64),
                                      ("rows", (C, self.Ep), dt)])
            slot = self.slots[C] = _Slot(self.xp, layout, nbytes, C, self.E, dt)
        return slot

    def run(self, label, dense, rows, inverse, timers=None):
        """The step on the device from host ``label`` (B,), ``dense`` (B, Fd), ``rows``
        (U, E) and ``inverse`` (B*F,) -> (the (2,) float64 device pair (loss sum, label
        sum), the (U, E) device gradient sums). Both stay valid until the next ``run``.
        ``timers`` (``timers.EventTimers``): its ``fwd_bwd`` phase gets the device time
        of the copy and the graph, the host's packing before them left out."""
        U = rows.shape[0]
        slot = self._slot(U)
        used = self._pack(slot, {"label": label, "dense": dense, "inverse": inverse,
                                 "rows": rows})
        with timers.time("fwd_bwd") if timers is not None else contextlib.nullcontext():
            slot.raw[:used].set(self.pinned[:used], stream=self.stream)  # ONE async H2D
            self.copied = self.xp.cuda.Event()
            self.copied.record()
            if slot.graph is not None:
                self._launch(slot)
            elif self.graphs and slot.runs >= 1:
                self._capture(slot)
            else:
                self._body(slot)
        slot.runs += 1
        return slot.pair, slot.sums[:U]

    def rows_out(self, U: int) -> np.ndarray:
        """The (U, E) part of the pinned buffer that the next ``run`` with U distinct rows
        copies them from: a pull writes them there (``Mode.unique_rows(out=)``), and
        ``run`` then packs them in place instead of copying them."""
        slot = self._slot(U)
        self._writable(slot)
        return self._part(slot, "rows", U)

    def _writable(self, slot: _Slot) -> None:
        """The pinned buffer holds ``slot`` and the last step's copy has read it."""
        if self.copied is not None:
            wait_event(self.copied)  # (long done)
            self.copied = None
        self.pinned = pinned_buffer(self.xp, self.pinned, slot.raw.size)

    def _part(self, slot: _Slot, name: str, n: int) -> np.ndarray:
        """``name``'s place in the pinned buffer for ``n`` values (rows: the (n, E) columns
        of (n, Ep), the pad zeroed). Nothing but zeros is ever written to the pad, so it is
        zeroed once per buffer and offset, for the rows past those zeroed before."""
        o, _, t = slot.layout[name]
        if name != "rows":
            return self.pinned[o:o + n * t.itemsize].view(t)
        dst = self.pinned[o:o + n * self.Ep * t.itemsize].view(t).reshape(n, self.Ep)
        buf, at, done = self.pad_zeroed
        if buf is not self.pinned or at != o:
            done = 0
        if done < n:
            dst[done:, self.E:] = 0
            self.pad_zeroed = (self.pinned, o, n)
        return dst[:, :self.E]

    def _pack(self, slot: _Slot, arrays: dict) -> int:
        """Pack ``arrays`` into the pinned buffer at ``slot``'s offsets (the rows padded
        with zeros to the slot's width; already there when they are ``rows_out``'s) -> the
        bytes to copy (the rows past U are not)."""
        off, _, dt = slot.layout["rows"]
        U = arrays["rows"].shape[0]
        self._writable(slot)
        for name, a in arrays.items():
            if name == "rows" and np.may_share_memory(a, self.pinned):
                continue  # pulled in place (rows_out)
            dst = self._part(slot, name, U if name == "rows" else a.size)
            np.copyto(dst, a.reshape(dst.shape), casting="same_kind")
        return off + U * self.Ep * dt.itemsize

    def _body(self, slot: _Slot) -> None:
        """The step's device work on ``slot``'s static buffers (module docstring)."""
        from . import cuda
        from .models import checked_demb

        B, F, E, Ep = self.B, self.F, self.E, self.Ep
        emb = cuda.gather(slot.rows, slot.inverse).reshape(B, F, Ep)
        logits = self.model.forward(slot.dense, emb)
        losses, dz = bce_with_logits(logits, slot.label, self.scale)
        self.params.zero_grad()
        demb = checked_demb(self.model.backward(dz), emb)  # (B, F, Ep): 0 past E
        cuda.scatter_add(slot.inverse, demb.reshape(B * F, Ep), slot.C, out=slot.padded_sums)
        if Ep != E:
            slot.sums[...] = slot.padded_sums[:, :E]
        slot.pair[0] = losses.sum()
        slot.pair[1] = slot.label.sum()

    def _capture(self, slot: _Slot) -> None:
        """Capture ``slot``'s body as a graph (its allocations from the graphs' pool, the
        bucket cuts recorded) and launch it; a capture that fails runs the body eagerly and
        turns the graphs off."""
        seen, hook = [], self.params.on_grads_ready
        self.params.on_grads_ready = lambda names: seen.append(tuple(names))
        try:
            with self.xp.cuda.using_allocator(self.pool.malloc):
                self.stream.begin_capture()
                try:
                    self._body(slot)
                finally:
                    graph = self.stream.end_capture()
        except Exception as e:  # noqa: BLE001 - any failure: eager from now on, said why
            graph, self.graphs = None, False
            self.why_eager = f"capture failed: {type(e).__name__}: {e}"
        finally:
            self.params.on_grads_ready = hook
        if graph is None:
            self._body(slot)
            return
        slot.graph, slot.ready = graph, seen if hook is not None else []
        self._launch(slot)

    def _launch(self, slot: _Slot) -> None:
        slot.graph.launch(stream=self.stream)
        for names in slot.ready:  # the body's bucket cuts, as backward made them
            self.params.grads_ready(*names)

    @property
    def status(self) -> str:
        """'on', or 'off: <why>' (the run's summary says it)."""
        return "on" if self.graphs else f"off: {self.why_eager}"
