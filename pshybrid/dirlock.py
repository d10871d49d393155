"""One job per directory: ``DirLock`` holds a ``--checkpoint-dir`` for the job that writes it.

A lock file ``.pshybrid-lock``, created with ``O_CREAT|O_EXCL``, names the holder (host, pid,
the process's start time, the batch job and its restarts), and the holder keeps an exclusive
``flock`` on it while it runs, which the kernel drops when the process ends. Another job finds
the lock held when that ``flock`` is (on any host, in any PID namespace or container, where the
filesystem supports it), or, from what the file names, when its holder may still run: on another
host (never judged from here), or on this host alive, or alive and not inspectable (``/proc``
mounted with ``hidepid``). It takes over a stale lock: a holder on this host that is gone or
whose pid now runs another process, or the same batch job's earlier run (a requeue).
Pure Python (no MPI).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket

from .safeio import read_small_text

LOCK_NAME = ".pshybrid-lock"
# A batch job's id, kept by a requeue: a lock of the same id and fewer restarts
# (SLURM_RESTART_COUNT) is the job's own earlier run.
BATCH_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")


def _stat_field(pid: int, i: int) -> str | None:
    """Field ``i`` after the command name of ``/proc/PID/stat`` (0: state, 19: start
    time), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[i]
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), None if unknown."""
    return _stat_field(pid, 19)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a killed job's rank
    whose parent, killed too, has not been reaped yet holds no lock)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        pass
    return _stat_field(pid, 0) not in ("Z", "X")


def _earlier_run(theirs: str, mine: str) -> bool:
    """Whether lock job token ``theirs`` (``id#restarts``) is an earlier run of this batch
    job: the same id, restarted fewer times (Slurm's SLURM_RESTART_COUNT after a requeue)."""
    (tid, _, tn), (mid, _, mn) = theirs.partition("#"), mine.partition("#")
    return mid != "-" and tid == mid and tn.isdigit() and int(tn) < int(mn)


def hold(fd: int) -> bool:
    """Take an exclusive ``flock`` on open file ``fd`` for as long as it stays open: False if
    another process holds one; True once held, or where the filesystem has no locks (the
    file alone tells then)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)
    return True


def flock_held(path: str) -> bool | None:
    """Whether another process holds a ``flock`` on ``path``: True, False, or None where
    this filesystem cannot tell (no locks: some NFS mounts) or the file cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return True if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)  # (drops the shared lock this probe took)


class DirLock:
    """An exclusive hold on directory ``root`` for one job: ``acquire()`` creates
    ``root/.pshybrid-lock`` (the directory too, if missing), locks it and writes the holder;
    ``release()`` removes it (only if it is still this process's) and the directory if
    acquire made it and it is empty."""

    def __init__(self, root: str):
        self.root, self.path = root, os.path.join(root, LOCK_NAME)
        job = "_".join(next((os.environ[v] for v in BATCH_JOB_VARS if os.environ.get(v)),
                            "-").split()).replace("#", "_") or "-"
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        self.job = f"{job}#{restarts if restarts.isdigit() else 0}"
        self.mine = f"{socket.gethostname()} {os.getpid()} {_start_time(os.getpid())} {self.job}\n"
        self.held = self.made = False
        self.fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns a one-line notice when a stale lock was taken over. Raises
        FileExistsError with the reason when another job holds it, OSError otherwise."""
        if not os.path.isdir(self.root):
            os.makedirs(self.root)
            self.made = True
        notice = None
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o644)
            except FileExistsError:
                notice = self._take_over() or notice
                continue
            hold(fd)  # before its text: a reader who sees a holder named sees it held
            try:
                os.write(fd, self.mine.encode())
                os.fsync(fd)
                if not os.path.samestat(os.fstat(fd), os.stat(self.path)):  # (taken as empty
                    raise FileExistsError(f"{self.path}: another job took it at the same "
                                          "moment")  # by a job that came before the flock)
            except BaseException:  # (a full disk: no empty lock left behind to refuse others)
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                        os.unlink(self.path)
                os.close(fd)
                raise
            self.fd, self.held = fd, True
            return notice
        raise FileExistsError(f"{self.path}: another job took it at the same moment")

    def _take_over(self) -> str | None:
        """Move a stale lock away (raising FileExistsError naming a live holder)."""
        try:
            text = read_small_text(self.path, 512)
        except (OSError, ValueError):
            text = ""
        why = self._stale(text)
        aside = f"{self.path}.{os.getpid()}.stale"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:  # another job moved it first: try to create it again
            return None
        if read_small_text(aside, 512) != text:  # another job's fresh lock: put it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            os.unlink(aside)
            raise FileExistsError(f"{self.root} is in use by another job ({self.path})")
        os.unlink(aside)
        return f"pshybrid: note: {self.path}: stale lock of {why}: taken over"

    def _stale(self, text: str) -> str:
        """Why the lock holding ``text`` is stale; FileExistsError if it may be held."""
        held = flock_held(self.path)  # True: its process runs, wherever its pid is visible
        try:
            host, pid, start, *job = text.split()
            pid_n = int(pid)
        except ValueError:
            if held is False:  # (a holder that ended between making the file and writing it)
                return "no holder named, and none holding it"
            raise FileExistsError(f"{self.root} is locked ({self.path} names no holder"
                                  f"{', and a process holds it' if held else ''}): if no job "
                                  f"uses it, remove {self.path}") from None
        in_use = (f"{self.root} is in use by another job: pid {pid} on host {host} holds "
                  f"{self.path}; choose another --checkpoint-dir or wait for it to end")
        if held:
            raise FileExistsError(in_use)
        if job and _earlier_run(job[0], self.job):
            return (f"pid {pid} on {host}, an earlier run of batch job "
                    f"{job[0].split('#')[0]} (requeued)")
        if host != socket.gethostname():
            raise FileExistsError(f"{self.root} is in use by pid {pid} on host {host} "
                                  f"({self.path}); it is not judged from here: if no job runs "
                                  f"there, remove {self.path}")
        if not _alive(pid_n):
            return f"pid {pid} on {host}, which is gone"
        now = _start_time(pid_n)
        if now is None:  # alive, but /proc hides it (hidepid): it may be the holder
            raise FileExistsError(f"{in_use} (its start time cannot be read here: if no job "
                                  f"uses it, remove {self.path})")
        if start != now:
            return f"pid {pid} on {host}, now another process (another start time)"
        raise FileExistsError(in_use)

    def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(OSError, ValueError):
                if read_small_text(self.path, 512) == self.mine:
                    os.unlink(self.path)
        if self.fd is not None:
            os.close(self.fd)  # (after the unlink: the flock lasts as long as the file)
            self.fd = None
        if self.made:
            self.made = False
            with contextlib.suppress(OSError):
                os.rmdir(self.root)  # only if empty: no checkpoint was written

    close = release


def in_use(root: str) -> str | None:
    """Why another job holds ``root`` (what ``DirLock(root).acquire`` would raise), without
    taking or moving anything; None when nobody does (no lock, or a stale one)."""
    lock = DirLock(root)
    try:
        text = read_small_text(lock.path, 512)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        text = ""
    if text == lock.mine:  # (this process's own)
        return None
    try:
        lock._stale(text)
    except FileExistsError as e:
        return str(e)
    return None
