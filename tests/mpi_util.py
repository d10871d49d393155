"""Helpers shared by the tests: collective asserts and whole-job launches."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

JOB_TIMEOUT = float(os.environ.get("PSHYBRID_TEST_JOB_TIMEOUT", "120"))
# --shared-memory of the MPI tests' training runs: tests/run.py sets "off" for one world size,
# so training is also checked over RMA end to end (what crosses nodes).
SHARED_MEMORY = os.environ.get("PSHYBRID_TEST_SHARED_MEMORY", "auto")


def assert_all(comm, ok: bool, msg: str = "") -> None:
    """Collective assert: every rank fails if any rank's ``ok`` is false, naming them.

    Wire: allgather of (ok, msg) over ``comm``; all ranks wait. Reduce before asserting,
    so one rank's failure cannot leave the others waiting in the next collective.
    """
    verdicts = comm.allgather((bool(ok), "" if ok else str(msg)))
    bad = [f"rank {r}: {m}" for r, (good, m) in enumerate(verdicts) if not good]
    assert not bad, "; ".join(bad)


def mpiexec() -> str:
    """The mpiexec of the environment running the tests (the mpich wheel's)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def run_job(n: int, args: list[str], timeout: float = JOB_TIMEOUT, env=None):
    """Run ``mpiexec -n n <args>`` with a hard timeout; return CompletedProcess.

    A job that outlives ``timeout`` is killed and the test fails (a hang is a failure).
    """
    cmd = [mpiexec(), "-n", str(n)] + args
    full_env = dict(os.environ, **(env or {}))
    # a session of its own: a hung job is killed whole (killing mpiexec alone orphaned its
    # ranks, which busy-poll in MPI and slowed every later test and benchmark)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=full_env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"job hung: {' '.join(cmd)} ran past {timeout}s\n"
                             f"stdout: {out}\nstderr: {err}") from None
    finally:
        if p.poll() is None:  # (an exception here: pytest-timeout's, a KeyboardInterrupt)
            os.killpg(p.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def signal_when(cmd: list[str], ready, sig: int, **popen) -> tuple[int, str, str]:
    """Start ``cmd`` in a session of its own, send it ``sig`` once ``ready()`` holds (or it
    ended, or ``JOB_TIMEOUT`` passed), and return (status, stdout, stderr); a job still
    running ``JOB_TIMEOUT`` later is killed whole (a hang is a failure)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True, **popen)
    try:
        deadline = time.time() + JOB_TIMEOUT
        while p.poll() is None and time.time() < deadline and not ready():
            time.sleep(0.05)
        p.send_signal(sig)
        out, err = p.communicate(timeout=JOB_TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    return p.returncode, out, err


def pshybrid(*args: str) -> list[str]:
    """argv that runs ``python -m pshybrid args...`` in this interpreter."""
    return [sys.executable, "-m", "pshybrid", *args]


def snapshot(root) -> dict:
    """Every entry under ``root``: a link's target, a file's hash, 'dir' or 'special'."""
    snap = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                snap[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                snap[rel] = "dir"
            elif not os.path.isfile(p):  # a FIFO, socket or device: never opened (it may block)
                snap[rel] = "special"
            else:
                snap[rel] = hashlib.sha1(open(p, "rb").read()).hexdigest()
    return snap
