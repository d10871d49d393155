"""Shared by the benchmarks in this folder (imported as a sibling: `python bench/X.py`)."""

import re
import statistics
import time

from pshybrid.timers import PHASES
from pshybrid.timers import Timers


def description(doc: str) -> str:
    """A script's ``--help`` description: the first sentence of its docstring's first prose
    paragraph (not a usage line), on one line (up to a list it introduces)."""
    paras = [p for p in doc.split("\n\n") if p.strip()
             and not p.lstrip().startswith(("python ", "mpiexec ", "#"))]
    text = " ".join(line.strip() for line in (paras or [doc])[0].splitlines())
    end = re.search(r"\.(\s|$)", text)
    text = text[:end.start() + 1] if end else text
    if len(text) > 300 and ": " in text[:300]:  # a list follows: its introduction
        text = text[:text[:300].rindex(": ")] + "."
    return text


def machine() -> str:
    """The CPU a benchmark's figures come from, for its header: the model, the cores, and
    the widest vector extension NumPy dispatches to (NumPy's ``log``/``exp`` and numba's
    64-bit multiplies take twice as long, or more, without AVX-512)."""
    import os

    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh
                          if line.startswith(("model name", "Model"))), "")
    except OSError:
        pass
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # (NumPy 1.x)
        from numpy.core._multiarray_umath import __cpu_features__ as features
    simd = next((name for key, name in (("AVX512F", "AVX-512"), ("AVX2", "AVX2"),
                                        ("SVE", "SVE"), ("ASIMD", "NEON"))
                 if features.get(key)), "none")
    import platform

    try:  # (LLVM's name of the core, which numba compiles for: a VM's model may be generic)
        from llvmlite import binding

        model += f" ({binding.get_host_cpu_name()})"
    except Exception:  # noqa: BLE001  (numba absent, or an old llvmlite: the model alone)
        pass
    return f"{model.strip() or platform.machine()}, {os.cpu_count()} cores, NumPy SIMD: {simd}"


def write_json(path: str, doc: dict) -> None:
    """A benchmark's ``--json``, replaced atomically: a run killed while writing it (Ctrl-C,
    a pipe closed by ``| head``) leaves the earlier file whole, not one the next run's
    ``check_outputs`` refuses as not JSON."""
    import json

    from pshybrid.safeio import atomic_write_text

    atomic_write_text(path, json.dumps(doc, indent=1))


IMAGE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "ps", "eps")


_OUTPUT_BYTES = 64 << 20  # an earlier JSON output or image is smaller than this


def check_outputs(parser, json_path=None, image_path=None, inputs=()) -> None:
    """Before a benchmark runs (every rank, the same verdict, before any collective): its
    ``--json`` may be a new file or an earlier JSON output, its image a new file or an
    image, of a format matplotlib writes; never an input (``(option, path)``) nor a
    non-regular file. Else ``parser.error`` names the option (exit status 2, nothing
    written)."""
    import json
    import os

    from pshybrid import safeio
    from pshybrid.plot import IMAGE_MAGIC

    def earlier(path, what, ok):
        try:
            with open(path, "rb") as fh:  # (a bounded read: a multi-GB dataset given by
                raw = fh.read(_OUTPUT_BYTES + 1)  # mistake is refused without loading it)
            if len(raw) <= _OUTPUT_BYTES and ok(raw):
                return None
        except OSError:
            pass
        return (f"{path} exists and is not {what}: not replaced; remove it yourself or "
                "choose another name")

    def is_json(raw):
        try:
            return isinstance(json.loads(raw), dict)
        except ValueError:
            return False

    for option, path, what, ok in (
            ("--json", json_path, "an earlier JSON output", is_json),
            ("--png", image_path, "an image", lambda raw: raw.startswith(IMAGE_MAGIC))):
        if not path:
            continue
        ext = path.rsplit(".", 1)[-1].lower() if "." in path else ""
        problem = (f"{path}: unknown image format {ext!r}: use one of "
                   f"{', '.join(IMAGE_FORMATS)}" if option == "--png"
                   and ext not in IMAGE_FORMATS else
                   safeio.check_output(path, option, inputs, existing=lambda p, w=what, o=ok:
                                       earlier(p, w, o)))
        folder = os.path.dirname(os.path.abspath(path))
        if not problem and not os.path.isdir(folder):  # (found after the run, its results lost)
            problem = f"{path}: no directory {folder} to write it in"
        if problem:
            parser.error(problem if problem.startswith(option) else f"{option}: {problem}")


def at_least(lo: int):
    """An argparse ``type``: an integer >= ``lo`` (a count of steps, repeats, rows), else the
    option's one-line error (exit status 2) instead of a traceback after the setup."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v}: must be >= {lo}")
        return v
    return parse


def above(lo: float):
    """An argparse ``type``: a number > ``lo`` (a speed-up, a bandwidth), else the option's
    one-line error (exit status 2) instead of a traceback or a silently ignored value."""
    import argparse

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not v > lo:
            raise argparse.ArgumentTypeError(f"{v:g}: must be > {lo:g}")
        return v
    return parse


def median_time(fn, warmup: int, repeat: int, clock=time.perf_counter) -> float:
    """Seconds: median of ``repeat`` timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


class StepTimers(Timers):
    """The mode's phase timers, also kept per step: ``mark()`` (a worker's ``on_step``) closes
    a step's phase seconds; every ``server_apply`` increment (one per server step) is kept.
    Installed as the modes' ``Timers`` for the benchmark's runs (``last``: the newest)."""

    last = None

    def __init__(self):
        super().__init__()
        self.steps: list[dict] = []
        self.applies: list[float] = []
        self._seen: dict = {}
        StepTimers.last = self

    def __setitem__(self, key, value):
        if key == "server_apply" and key in self:
            self.applies.append(value - self[key])
        super().__setitem__(key, value)

    def mark(self, done=None) -> None:
        now = dict(self)
        self.steps.append({k: now.get(k, 0.0) - self._seen.get(k, 0.0) for k in PHASES})
        self._seen = now


def timed_stats(worker_steps, reporter_steps, step_seconds, server_applies) -> dict:
    """Over the timed steps: worker_steps = per worker, per step {phase: s}; reporter_steps:
    the reporter's own; step_seconds: the reporter's step wall times; server_applies: per
    server, per step. Per phase the workers' mean of each step, then median / mean over the
    steps; the untimed rest of the reporter's steps; the slowest server's apply per step;
    each worker's median fwd_bwd; and the per-step series themselves (``timed_series``:
    the workers' mean and each worker's phases)."""
    n = len(step_seconds)
    per_step = [{k: statistics.fmean(w[t][k] for w in worker_steps) for k in PHASES}
                for t in range(n)]
    untimed = [s - sum(r.values()) for s, r in zip(step_seconds, reporter_steps)]
    applies = [max(a[t] for a in server_applies) for t in range(n)] if server_applies else \
        [0.0] * n
    return {
        "phase_seconds_timed_median": {k: statistics.median(p[k] for p in per_step)
                                       for k in PHASES},
        "phase_seconds_timed_mean": {k: statistics.fmean(p[k] for p in per_step)
                                     for k in PHASES},
        "untimed_seconds_timed_median": statistics.median(untimed),
        "untimed_seconds_timed_mean": statistics.fmean(untimed),
        "step_seconds_timed_mean": statistics.fmean(step_seconds),
        "server_apply_seconds_timed_median": statistics.median(applies),
        "server_apply_seconds_timed_mean": statistics.fmean(applies),
        "fwd_bwd_timed_median_per_worker": [statistics.median(s["fwd_bwd"] for s in w)
                                            for w in worker_steps],
        "timed_series": {"step": [round(x, 7) for x in step_seconds],
                         "untimed": [round(x, 7) for x in untimed],
                         "server_apply": [round(x, 7) for x in applies],
                         "phases": {k: [round(p[k], 7) for p in per_step] for k in PHASES},
                         "phases_by_worker": [{k: [round(s[k], 7) for s in w] for k in PHASES}
                                              for w in worker_steps]},
    }


class HostClock:
    """Marks on the host clock (``perf_counter``), after ``sync()`` (default: none): the
    CPU stand-in of ``CudaClock`` with the same two methods."""

    def __init__(self, sync=None, clock=time.perf_counter):
        self.sync, self.clock = sync, clock

    def mark(self):
        if self.sync is not None:
            self.sync()
        return self.clock()

    def elapsed(self, start, stop) -> float:
        return stop - start


class CudaClock:
    """Marks as CUDA events recorded on the current stream; ``elapsed`` waits for the stop
    event and returns the device time between the two (seconds): what the kernels took, not
    what Python took to launch them (as long as the launches stay ahead of the device)."""

    def __init__(self, cp):
        self.cp = cp

    def mark(self):
        event = self.cp.cuda.Event()
        event.record()
        return event

    def elapsed(self, start, stop) -> float:
        stop.synchronize()
        return self.cp.cuda.get_elapsed_time(start, stop) / 1e3


def per_launch(fn, clock, launches: int, repeat: int, warmup: int = 2) -> float:
    """Seconds per call of ``fn``: median over ``repeat`` rounds of ``launches`` back-to-back
    calls between two ``clock`` marks, after ``warmup`` untimed calls. Many launches between
    two marks amortise the marks themselves, and on a GPU (``CudaClock``) the host's launch
    cost overlaps the previous kernels, so a ~30 us kernel is not timed as its ~20 us Python
    call. Time a reference (a device-to-device copy of the same bytes) the same way."""
    assert launches >= 1 and repeat >= 1, (launches, repeat)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = clock.mark()
        for _ in range(launches):
            fn()
        times.append(clock.elapsed(start, clock.mark()) / launches)
    return statistics.median(times)
