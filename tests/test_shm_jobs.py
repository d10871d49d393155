"""The servers' shards in /dev/shm: a shortage that appears after the check before step 1
(another job on the node taking the space) is an error when the store is built, not a
SIGBUS at the first write. Each case runs in a private mount namespace with a small tmpfs
of its own on /dev/shm (root and ``unshare --mount``), so nothing else on the machine sees it.
"""

import os
import subprocess
import sys

import pytest
from mpi4py import MPI

from mpi_util import mpiexec

pytestmark = pytest.mark.job
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def in_private_shm(size_mib: int, cmd: str, timeout: float = 120):
    """Run the shell command ``cmd`` with a ``size_mib`` MiB tmpfs of its own on /dev/shm
    (skip where this process may not make one); -> CompletedProcess."""
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs -o size={size_mib}m tmpfs /dev/shm && {cmd}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        probe = subprocess.run(wrap[:-1] + ["mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"needs unshare --mount and a tmpfs of its own on /dev/shm: {e}")
    if probe.returncode:
        pytest.skip("needs unshare --mount and a tmpfs of its own on /dev/shm (root): "
                    + probe.stderr.strip())
    try:
        return subprocess.run(wrap, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"hung past {timeout}s: {cmd}\n{exc.stdout}\n{exc.stderr}") from None


@pytest.mark.parametrize("shared", ["on", "off"])
def test_a_shard_past_what_dev_shm_has_left_is_an_error_on_every_rank_not_a_sigbus(shared):
    """A 32 MiB shard in a 64 MiB /dev/shm: fits alone; with another job's file leaving
    8 MiB (written after MPI started, as a job starting beside this one does), every rank
    ends with one line naming /dev/shm, exit status 2, nothing left there (it was a SIGBUS:
    'BAD TERMINATION ... Bus error', exit 7 or 15, mpich_shm_* files left)."""
    if not MPI.Get_library_version().startswith(("MPICH", "Intel")):  # (both: /dev/shm files)
        pytest.skip("the windows of this MPI library are not known to be /dev/shm files")
    job = f"timeout 100 {mpiexec()} -n 2 {sys.executable} {HERE}/jobs/store_in_full_shm.py"
    alone = in_private_shm(64, f"{job} none {shared}")
    assert alone.returncode == 0 and "stored" in alone.stdout, (alone.returncode, alone.stderr)
    p = in_private_shm(64, f"{job} fill {shared}; rc=$?; echo left: $(ls /dev/shm); exit $rc")
    out = p.stdout + p.stderr
    assert p.returncode == 2, (p.returncode, out)
    assert "Bus error" not in out and "Traceback" not in out, out
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pshybrid: error")]
    assert sorted(ln[:27] for ln in lines) == ["pshybrid: error (rank 0/2):",
                                               "pshybrid: error (rank 1/2):"], out
    for ln in lines:
        assert "/dev/shm cannot hold this rank's 32.0 MiB shard of the tables (the MPI " \
               "library maps it from a file there; No space left on device, " in ln, ln
        assert ln.endswith("give the job more shared memory (a container: --shm-size), "
                           "spread the table over more --servers on more nodes, or lower "
                           "--embedding-dim"), ln
    left = [ln for ln in p.stdout.splitlines() if ln.startswith("left:")]
    assert left == ["left: other_job"], p.stdout  # (the job's own files: unlinked)


RESERVE = """
import mmap, os, sys
import pshybrid.transport as t
if sys.argv[1] == "fallocate":
    t.MADV_POPULATE_WRITE = 999  # an advice no kernel has: EINVAL, as a kernel before 5.14
def mapped(mib):
    fd = os.open("/dev/shm/window", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, mib << 20)  # sparse: what MPICH does, then it unlinks and closes it
    m = mmap.mmap(fd, mib << 20)
    os.unlink("/dev/shm/window"); os.close(fd)
    return m
def used():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize
fits, before = mapped(4), used()
t.reserve_shared_memory(memoryview(fits)[100:])  # (not on a page boundary)
print("reserved", used() - before >> 20)
t.reserve_shared_memory(mmap.mmap(-1, 64 << 20))  # anonymous: nothing to do
try:
    t.reserve_shared_memory(mapped(16))
except MemoryError as e:
    print("refused", e)
"""


@pytest.mark.parametrize("how", ["populate", "fallocate"])
def test_reserve_shared_memory_allocates_the_pages_or_raises(how):
    """A window mapped from an unlinked, sparse file in an 8 MiB /dev/shm: 4 MiB are
    allocated at once (the tmpfs counts them), 16 MiB are a MemoryError (not a SIGBUS at the
    first write), anonymous memory is left alone; by MADV_POPULATE_WRITE and, where a kernel
    lacks it, by posix_fallocate on the file (here root may open /proc/self/map_files)."""
    p = in_private_shm(8, f"{sys.executable} -c '{RESERVE}' {how}", timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    reserved, refused = p.stdout.splitlines()
    assert reserved == "reserved 4", p.stdout
    assert refused.startswith("refused /dev/shm cannot hold this rank's 16.0 MiB shard of "
                              "the tables (the MPI library maps it from a file there; No "
                              "space left on device, "), refused
