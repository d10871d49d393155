"""MPI transport helpers: datatypes for indexed RMA, polite waiting, shared verdicts, the
job-wide abort on error, and the dense Allreduce of a NumPy or CuPy buffer (``iallreduce``
synchronises the CUDA stream before MPI touches a GPU buffer, so no caller can forget; a
training step, which synchronises once for all its MPI calls, uses ``start_allreduce``)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from .backend import array_module, synchronize
from .errors import ConfigError, InputError, PshybridError, pipe_closed, say
from .limits import SHM_WAYS_OUT

_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}


def mpi_type(dtype) -> MPI.Datatype:
    """The predefined MPI datatype of a float32/float64 NumPy dtype."""
    try:
        return _MPI_TYPES[np.dtype(dtype)]
    except KeyError:
        raise PshybridError(f"unsupported dtype {dtype!r}: use float32 or float64") from None


def rows_type(base: MPI.Datatype, dim: int, byte_disps: np.ndarray) -> MPI.Datatype:
    """Committed datatype selecting ``dim`` elements at each byte displacement: an
    ``hindexed_block(dim, byte_disps)`` of ``base``.

    Displacements are 64-bit byte offsets (MPI_Aint), so tables past 2**31 elements
    work. The caller frees it after the operation that uses it has been flushed.
    Built by one call of the MPI library's ``MPI_Type_create_hindexed_block`` on the
    array itself where ``_c_hindexed_block`` finds it (mpi4py converts its argument one
    element at a time: 0.4 ms for 22k rows, docs/benchmarks.md); else through mpi4py
    from a list (which it converts faster than an int64 array).
    """
    call = _c_hindexed_block()
    n = byte_disps.size
    if call is None or n >= 2**31:
        return base.Create_hindexed_block(dim, byte_disps.tolist()).Commit()
    fn, handle = call
    disps = np.ascontiguousarray(byte_disps, dtype=np.int64)  # MPI_Aint: 64-bit here
    out = handle()
    rc = fn(n, dim, disps.ctypes.data, handle(base.handle), ctypes.byref(out))
    if rc != MPI.SUCCESS:
        raise MPI.Exception(rc)
    return MPI.Datatype.fromhandle(out.value).Commit()


_C_CALL: list = []  # [(function, handle ctype) or None], found once


def _c_hindexed_block():
    """``(MPI_Type_create_hindexed_block, the MPI_Datatype ctype)`` of the MPI library
    mpi4py runs on, or None where its symbol cannot be found or its types are not the
    ones assumed (MPI_Aint of 8 bytes; handles of 4 bytes as MPICH's or 8 as Open MPI's)."""
    if not _C_CALL:
        fn = None
        size = MPI._sizeof(MPI.Datatype)
        handle = {4: ctypes.c_uint, 8: ctypes.c_void_p}.get(size)
        if handle is not None and MPI.AINT.Get_size() == 8:
            for lib in (MPI.__file__, None):  # its extension module (and libmpi under it)
                try:
                    fn = getattr(ctypes.CDLL(lib), "MPI_Type_create_hindexed_block")
                    break
                except (OSError, AttributeError):
                    continue
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, handle,
                           ctypes.POINTER(handle)]
        _C_CALL.append(None if fn is None else (fn, handle))
    return _C_CALL[0]


def _sleep_until(test, max_sleep: float) -> None:
    """Call ``test()`` (an MPI Test/Iprobe: drives progress) until true, sleeping between
    calls with exponential back-off from 1 µs up to ``max_sleep`` seconds."""
    sleep = 1e-6
    while not test():
        time.sleep(sleep)
        sleep = min(2 * sleep, max_sleep)


def poll_wait(req: MPI.Request, max_sleep: float = 1e-3) -> None:
    """Wait for ``req`` without spinning a core. For ranks that only idle (servers), so
    oversubscribed nodes keep their cores for the workers."""
    _sleep_until(req.Test, max_sleep)


def precise_sleeps() -> None:
    """Linux: shrink this thread's timer slack from 50 us to 1 us, so the short sleeps of a
    polling loop end on time instead of late by up to the slack."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in nanoseconds
    except (OSError, AttributeError):
        pass  # not Linux: sleeps are merely late


class Pacer:
    """Waits for an event that recurs about every ``gap`` seconds (a server waiting for the
    next step's messages) with little latency and little CPU: a nap through ``nap`` of the
    expected gap (the core goes to the workers), then checks: back to back (yielding the
    core to anyone runnable) when this rank has a core of its own (``own_core``), else every
    ``fine`` seconds; past twice the expected gap (the job idles: evaluation, checkpoint,
    end) the checks back off to every ``idle`` seconds. The expected gap is the median of
    the last 8.

    Why: a sleeping rank now and then wakes up much later than it asked, and every step
    waits for the server's answer, so a server with a core of its own checks without
    sleeping. With fewer cores than ranks those checks would take the workers' CPU, so
    there it naps through the part of the gap no message can arrive in and then checks
    every ``fine`` seconds. Workers themselves keep MPI's spinning waits: a rank sleeping
    in a collective stalls its partner. (The step times behind each choice:
    docs/benchmarks.md, "Design measurements behind the code".)"""

    def __init__(self, fine: float = 100e-6, idle: float = 1e-3, nap: float = 0.5,
                 own_core: bool = False):
        self.fine, self.idle, self.nap, self.own_core = fine, idle, nap, own_core
        self.gaps: list[float] = []
        precise_sleeps()

    def wait(self, test, learn: bool = True) -> None:
        """Call ``test()`` (an MPI Test/Iprobe: drives progress) until true. ``learn``: this
        wait starts a gap (the first message of a step), else it is a follow-up (no nap).
        The nap is slept in slices of at most ``idle``, each followed by a ``test()``: an
        early message is seen within ``idle`` and MPI keeps progressing meanwhile."""
        if test():
            self._learn(learn, 0.0)
            return
        t0 = time.perf_counter()
        gap = sorted(self.gaps)[len(self.gaps) // 2] if self.gaps else 0.0
        wake = t0 + (gap * self.nap if learn else 0.0)
        while (left := wake - time.perf_counter()) > self.fine:
            time.sleep(min(left, self.idle))
            if test():
                self._learn(learn, time.perf_counter() - t0)
                return
        sleep = self.fine
        while not test():
            late = time.perf_counter() - t0 > 2 * gap + self.idle
            if self.own_core and not late:
                os.sched_yield()
                continue
            time.sleep(sleep)
            if late:
                sleep = min(2 * sleep, self.idle)
        self._learn(learn, time.perf_counter() - t0)

    def _learn(self, learn: bool, gap: float) -> None:
        if learn:
            self.gaps = self.gaps[-7:] + [gap]

    def forget(self) -> None:
        """The last learned gap was not a step's (a checkpoint, the end): drop it."""
        self.gaps = self.gaps[:-1]


def poll_recv(comm: MPI.Comm, source: int, dtype=np.int64, max_sleep: float = 1e-3,
              pacer: Pacer | None = None, learn: bool = True, spin: bool = False,
              on_wait=None):
    """Receive one message of unknown length from ``source`` without spinning a core:
    Iprobe with back-off sleeps (or as ``pacer`` says), calling ``on_wait()`` before each,
    then Recv. ``spin``: wait in MPI's own (spinning) Probe instead, as a rank that trains
    does. Returns (array, tag)."""
    st = MPI.Status()

    def test():
        if on_wait is not None:
            on_wait()
        return comm.Iprobe(source, MPI.ANY_TAG, st)

    if spin:
        comm.Probe(source, MPI.ANY_TAG, st)
    elif pacer is not None:
        pacer.wait(test, learn)
    else:
        _sleep_until(test, max_sleep)
    base = mpi_type(dtype) if np.dtype(dtype).kind == "f" else MPI.INT64_T
    buf = np.empty(st.Get_count(base), dtype)
    comm.Recv([buf, base], source, st.tag)
    return buf, st.tag


def idle_barrier(comm: MPI.Comm, max_sleep: float = 1e-3) -> None:
    """Barrier that waits with ``poll_wait``. Wire: a zero-byte Ibarrier; all ranks wait."""
    poll_wait(comm.Ibarrier(), max_sleep)


_KINDS = {c.__name__: c for c in (PshybridError, ConfigError, InputError)}


def agree(comm: MPI.Comm, error: BaseException | None) -> None:
    """Collective verdict: if any rank has an error, raise on every rank.

    Every rank raises the same ``PshybridError`` carrying the lowest failing rank's
    message and class (``ConfigError``, ``InputError``; marked ``collective``), so a check
    that fails on one rank alone cannot leave the others hanging in the next collective.
    Wire: one allgather of (message, class name) or None; all wait.
    """
    kind = next((c.__name__ for c in type(error).__mro__ if c in _KINDS.values()), "")
    msgs = comm.allgather(None if error is None else (str(error), kind))
    for rank, got in enumerate(msgs):
        if got is not None:
            if isinstance(error, PshybridError) and rank == comm.rank:
                error.collective = True
                raise error
            # the failing rank's class (ConfigError, InputError) on every rank: a script's
            # ``except ConfigError`` catches it everywhere, or nowhere (never a hang)
            raise _KINDS.get(got[1], PshybridError)(f"rank {rank}: {got[0]}", collective=True)


def same_arguments(comm: MPI.Comm, call: str, who: str, rule: str = "", **args) -> None:
    """Collective over ``comm``: every rank passed ``call`` the same ``args`` (compared by
    ``repr``), else one ``PshybridError`` (``ConfigError``) on every rank naming the first
    that differs, the rank, and ``rule`` (default: "every <who> passes the same
    arguments"): ranks that differ go different ways (one waits for good, or reads other
    rows). Wire: one allgather of the arguments' reprs; all wait."""
    mine = tuple((k, repr(v)) for k, v in args.items())
    every = comm.allgather(mine)
    for r, theirs in enumerate(every):
        for (name, first), (_, other) in zip(every[0], theirs):
            if first != other:  # (long reprs: around where they part)
                at = max(len(os.path.commonprefix([first, other])) - 40, 0)
                cut = [("..." if at else "") + v[at:at + 120]
                       + ("..." if len(v) > at + 120 else "") for v in (other, first)]
                raise ConfigError(f"{call}: {name}={cut[0]} on {who} {r}, {name}={cut[1]} on "
                                  f"{who} 0: {rule or f'every {who} passes the same arguments'}",
                                  collective=True)


def release_shared_memory() -> list[str]:
    """Unlink the shared-memory files this process maps that still have a name (the MPI
    library's and the store's segments of this job on this node, under ``/dev/shm``), so
    a job that is about to die (abort, a second signal) leaves none behind; the mappings
    stay valid until the processes end. Returns the paths removed (Linux; elsewhere none)."""
    removed = []
    for p in sorted({m[4] for m in _shm_maps(0, 1 << 64)}):
        if not p.endswith("(deleted)"):
            with contextlib.suppress(OSError):
                os.unlink(p)
                removed.append(p)
    return removed


MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, an error instead of SIGBUS
_SHORT = (errno.ENOSPC, errno.EFAULT, errno.ENOMEM)  # (EFAULT: the touch would be a SIGBUS)


def _shm_maps(lo: int, hi: int) -> list[tuple[int, int, int, str, str]]:
    """[(start, end, file offset of start, /proc/self/map_files name, path)] of this
    process's mappings of files in ``/dev/shm`` (linked or not: a path ending in
    `` (deleted)``), clipped to the addresses [lo, hi)."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            lines = [ln.split(None, 5) for ln in f if " /dev/shm/" in ln]
    except OSError:
        return out
    for fields in lines:
        a, b = (int(x, 16) for x in fields[0].split("-"))
        if len(fields) == 6 and fields[5].startswith("/dev/shm/") and a < hi and lo < b:
            start = max(a, lo)
            out.append((start, min(b, hi), int(fields[2], 16) + start - a, fields[0],
                        fields[5].strip()))
    return out


def _reserve(start: int, end: int, offset: int, name: str) -> int:
    """Allocate the pages of the /dev/shm-backed addresses [start, end) now -> 0, or the
    errno of a shortage (``_SHORT``). MADV_POPULATE_WRITE where the kernel has it (any
    user); else posix_fallocate on the file, reached through /proc/self/map_files (MPICH
    has unlinked it and closed its descriptor; opening that needs CAP_SYS_ADMIN); neither:
    0, nothing reserved."""
    page = os.sysconf("SC_PAGE_SIZE")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lo = start // page * page  # (a window need not start on a page: its neighbour's is ours)
    err = 0 if libc.madvise(lo, end - lo, MADV_POPULATE_WRITE) == 0 else ctypes.get_errno()
    if err != errno.EINVAL:  # done, short, or another error (not ours to judge: none)
        return err if err in _SHORT else 0
    try:  # (EINVAL: a kernel older than 5.14)
        fd = os.open(f"/proc/self/map_files/{name}", os.O_RDWR)
    except OSError:
        return 0
    try:
        os.posix_fallocate(fd, offset, end - start)
    except OSError as e:
        return e.errno if e.errno in _SHORT else 0
    finally:
        os.close(fd)
    return 0


class NoSharedMemory(MemoryError):
    """``/dev/shm`` cannot hold a window's pages: the message names the ways out."""


def reserve_shared_memory(buf) -> None:
    """Allocate now the pages of ``buf`` (a rank's window: an MPI library maps it from a
    file in ``/dev/shm``, whose pages exist only once touched) so that a ``/dev/shm`` filled
    since the check before step 1 (another job starting beside this one) is a
    ``MemoryError`` here, not a SIGBUS without a message at the first write. Memory not
    backed by a file there (anonymous, another MPI library): nothing."""
    mem = np.frombuffer(buf, np.uint8)
    lo = mem.ctypes.data
    for start, end, offset, name, _ in _shm_maps(lo, lo + mem.nbytes):
        err = _reserve(start, end, offset, name)
        if err:
            free = os.statvfs("/dev/shm")
            why = os.strerror(errno.ENOSPC if err == errno.EFAULT else err)
            raise NoSharedMemory(
                f"/dev/shm cannot hold this rank's {mem.nbytes / 2**20:,.1f} MiB shard of the "
                f"tables (the MPI library maps it from a file there; {why}, "
                f"{free.f_bavail * free.f_frsize / 2**20:,.1f} MiB free now: another job may "
                f"have taken it since the check before step 1); {SHM_WAYS_OUT}")


def abort(comm: MPI.Comm, code: int) -> None:
    """End every rank of ``comm``'s job (MPI_Abort) after the launcher had a moment to
    forward what this rank printed; the job's shared memory on this node is unlinked first
    (the other ranks are killed, and cannot). Wire: MPI_Abort kills every rank; nobody
    waits."""
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if f is not None:
            f.flush()
    if comm.size > 1:
        release_shared_memory()
        time.sleep(0.3)
        comm.Abort(code)
    raise SystemExit(code)


def out_of_memory(exc: BaseException) -> str:
    """One line for an allocation that failed (``MemoryError``; the MPI library's window):
    what failed, this process's address-space limit if it has one, what to change (a full
    ``/dev/shm``: its own message's)."""
    import resource

    if isinstance(exc, NoSharedMemory):  # (its own ways out)
        return f"out of memory: {exc}"
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    where = f" (ulimit -v {limit // 1024})" if limit != resource.RLIM_INFINITY else ""
    return (f"out of memory{where}: {exc or 'an allocation failed'}: lower --batch-size, "
            "--embedding-dim or --mlp, or spread the table over more --servers on more nodes")


def allocate_window(nbytes: int, comm, shared: bool):
    """This rank's window of ``nbytes`` (``shared``: ``Win.Allocate_shared``, else
    ``Win.Allocate``), collective over ``comm``. The MPI library's refusal is a
    ``MemoryError`` naming it where it says memory, else an error naming its words and the
    likely ways out."""
    try:
        return (MPI.Win.Allocate_shared if shared else MPI.Win.Allocate)(nbytes, 1, comm=comm)
    except MPI.Exception as e:
        why = e.Get_error_string().strip().splitlines()[-1].split(":", 1)[-1].strip()
        what = f"this rank's {nbytes / 2**20:,.1f} MiB window of the tables' shard ({why})"
        if e.Get_error_class() == MPI.ERR_NO_MEM:
            raise MemoryError(f"the MPI library could not allocate {what}") from None
        raise PshybridError(window_refused(what, shared)) from None


def window_refused(what: str, shared: bool) -> str:
    """One line for a window the MPI library refused for a reason other than memory:
    ``what`` it refused (with its words), and the ways out. Open MPI 4's one-sided
    component for networks without RDMA (``osc pt2pt``, plain TCP) refuses every window
    under ``MPI_THREAD_MULTIPLE``, the level mpi4py asks for by default."""
    import resource

    how = [f"if {'/dev/shm' if shared else 'memory'} is short: {SHM_WAYS_OUT}"]
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:  # (a mapping past it is refused in the same words)
        how.insert(0, f"this process's address-space limit (ulimit -v {limit // 1024}) may be "
                   "what is short: raise it, or lower --batch-size, --embedding-dim or --mlp")
    if (MPI.Query_thread() == MPI.THREAD_MULTIPLE
            and MPI.Get_library_version().startswith("Open MPI")):
        how.insert(0, "if Open MPI said above that its osc pt2pt (no UCX, no RDMA) does not "
                   "support MPI_THREAD_MULTIPLE: set MPI4PY_RC_THREAD_LEVEL=serialized in every "
                   "rank's environment (docs/clusters.md)")
    return f"the MPI library refused {what}; " + "; ".join(how)


@contextlib.contextmanager
def abort_on_error(comm: MPI.Comm):
    """Run a block so that one failing rank can never leave the others waiting: a
    ``PshybridError`` marked ``collective`` (raised on every rank at the same point)
    propagates as usual; any other exception prints the rank and the error (a traceback for
    unexpected ones) and aborts the whole job (``abort``, exit status 2 for user errors,
    1 otherwise). A single-rank job just raises."""
    err = sys.__stderr__ or sys.stderr  # the process's own: a capture (pytest) dies with it
    try:
        yield
    except PshybridError as exc:
        if exc.collective or comm.size == 1:
            raise
        err.write(f"pshybrid: error (rank {comm.rank}/{comm.size}): {exc}\n")
        abort(comm, 2)
    except BrokenPipeError:  # stdout's reader ended: the job ends as SIGPIPE would end it
        if comm.size == 1:
            raise
        say(err, f"pshybrid: stopped (rank {comm.rank}/{comm.size}): {pipe_closed()}\n")
        abort(comm, 128 + signal.SIGPIPE)
    except MemoryError as exc:  # past what the check before step 1 counts: one line
        if comm.size == 1:
            raise
        err.write(f"pshybrid: error (rank {comm.rank}/{comm.size}): {out_of_memory(exc)}\n")
        abort(comm, 2)
    except Exception:
        if comm.size == 1:
            raise
        err.write(f"pshybrid: rank {comm.rank}/{comm.size}: uncaught exception:\n")
        traceback.print_exc(file=err)
        abort(comm, 1)


class _Staged:
    """An Iallreduce running on a pinned host copy of a device buffer; ``Wait`` completes it
    and copies the sum back to the device."""

    def __init__(self, req: MPI.Request, host: np.ndarray, dev):
        self.req, self.host, self.dev = req, host, dev

    def Wait(self) -> None:
        import cupy

        self.req.Wait()
        # async H2D on the current stream (pinned source: the host does not wait); later
        # kernels there see the sum, and the next D2H into ``host`` is queued after it
        self.dev.set(self.host, stream=cupy.cuda.get_current_stream())


_PINNED: dict = {}  # (device pointer, shape, dtype) -> pinned host mirror, reused every call


def iallreduce(comm: MPI.Comm, buf, cuda_aware: bool = False):
    """Start an in-place SUM Iallreduce of ``buf`` over ``comm``; ``.Wait()`` completes it.

    buf: a contiguous NumPy or CuPy array. For CuPy (a caller outside the training step,
    which stages its own copies: ``modes.step``): staged (not ``cuda_aware``), a
    device->host copy into a pinned mirror is queued; then the current stream is
    synchronised (MPI reads memory outside stream order: every kernel that wrote ``buf``,
    and the copy, have finished) and ``start_allreduce`` starts it.
    Wire: one (I)allreduce(SUM) of buf.nbytes over comm; each Wait waits for every rank's
    contribution.
    """
    if array_module(buf) is np:
        return comm.Iallreduce(MPI.IN_PLACE, [buf, mpi_type(buf.dtype)])
    host = None
    if not cuda_aware:
        import cupy
        import cupyx

        key = (buf.data.ptr, buf.shape, buf.dtype.str)
        host = _PINNED.get(key)
        if host is None:
            if len(_PINNED) >= 64:  # buffers of earlier runs; an in-flight request keeps its own
                _PINNED.clear()
            host = _PINNED[key] = cupyx.empty_pinned(buf.shape, buf.dtype)
        # async D2H, after the previous call's copy back on the same stream (stream order)
        buf.get(out=host, stream=cupy.cuda.get_current_stream(), blocking=False)
    synchronize(buf)  # the one host wait: the kernels that wrote buf, and the copy
    return start_allreduce(comm, buf, host)


def start_allreduce(comm: MPI.Comm, dev, host=None, copy_back: bool = True):
    """Start the in-place SUM Allreduce of the device buffer ``dev`` over ``comm``, once the
    caller has synchronised the stream after the last kernel that wrote ``dev`` and after
    the copy of ``dev`` into ``host`` (``iallreduce``; a training step: ``modes.step``).

    host: ``dev``'s pinned host copy (staged: an Iallreduce on it; ``Wait`` copies the sum
    back into ``dev`` asynchronously on the current stream), or None (CUDA-aware MPI: a
    *blocking* Allreduce of the device buffer, as CUDA-aware MPIs document device buffers for
    blocking collectives, Open MPI not for non-blocking ones; a completed request returned).
    ``copy_back=False`` (staged): ``Wait`` leaves the sum in ``host`` (the caller copies
    several buckets' sums back at once).
    Wire: one (I)allreduce(SUM) of dev.nbytes over comm; each Wait waits for every rank's
    contribution.
    """
    T = mpi_type(dev.dtype)
    if host is None:
        comm.Allreduce(MPI.IN_PLACE, [dev, T])  # Wire: device memory, CUDA-aware MPI, blocking
        return MPI.REQUEST_NULL  # (Wait on it returns at once)
    req = comm.Iallreduce(MPI.IN_PLACE, [host, T])  # Wire: its pinned host copy
    return _Staged(req, host, dev) if copy_back else req
