"""Filesystem primitives that never write through a path someone else planted.

Pure Python (no MPI). The rules every writer in pshybrid follows:

- A temporary file or directory always gets a fresh unique name, created by the call that
  makes it (``tempfile.mkstemp``/``mkdtemp``: ``O_CREAT|O_EXCL``, mode 0600/0700), in the
  directory of its final name; it is published with ``os.rename``/``os.replace``, which
  replaces a link at the final name instead of following it, and only while the final
  name holds what the output guard saw there (``publish_as``; nothing: atomically). A
  fixed name such as ``latest.tmp`` is never opened, so a link planted there redirects
  nothing.
- A name read back from disk (``latest``) is opened with ``O_NOFOLLOW`` and must be a
  regular file; what it names is checked against a pattern (``step-N``) before use.
- ``remove_tree`` removes only a real directory (never a link, never through one).
- ``check_writable`` probes a directory (or the nearest existing ancestor of one that does
  not exist yet) by writing a nameless temporary file there, so a missing, read-only or
  full directory is found before any work is done, without leaving anything behind.
- ``check_output`` is the one guard of every command's output file: never a file the
  command reads (same device and inode, or the same resolved name), never a file inside a
  checkpoint directory, never a non-regular file (a device such as ``/dev/null``, a FIFO,
  a directory); an existing file is replaced only when asked (``--overwrite``) and only
  when it is an earlier output of the same command (``output_kind``).
- One job holds a directory at a time: ``dirlock.DirLock``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile

_PROBE_BYTES = 4096
STEP_RE = re.compile(r"step-([0-9]+)")  # a checkpoint's step directory (``checkpoint_files``)
OUTPUT_ATTR = "pshybrid_output"  # HDF5 attribute on every output: the command that wrote it


def proc_status(key: str) -> str | None:
    """This process's ``key`` in Linux's /proc/self/status (its first word: ``Umask`` 0022,
    ``VmSize`` 123456), None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split()[1]
    except (OSError, IndexError):
        pass
    return None


def _umask() -> int:
    """The process umask, read without changing it (Linux /proc), else the usual 022."""
    try:
        return int(proc_status("Umask"), 8)
    except (TypeError, ValueError):  # (none, or not a number)
        return 0o022


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory (its entries: a rename in it is durable afterwards)."""
    _fsync(path, os.O_DIRECTORY)


def fsync_file(path: str) -> None:
    """fsync a file, never through a link."""
    _fsync(path, os.O_NOFOLLOW)


def atomic_write_text(path: str, text: str) -> None:
    """Replace ``path`` with a regular file holding ``text``, atomically: written to a fresh
    unique temporary in the same directory, fsync'ed, renamed over ``path`` (a link at
    ``path`` is replaced, never followed). On any error the temporary is removed."""
    d, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_temp_dir(parent: str, prefix: str) -> str:
    """A fresh private directory ``parent/<prefix><random>.tmp`` (mode 0700) that nobody
    else can have planted anything in; ``publish_dir`` renames it to its final name."""
    return tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)


def publish_dir(tmp: str, final: str) -> None:
    """Rename the private directory ``tmp`` to ``final`` (usual permissions), refusing to
    replace anything already at ``final`` (a directory, a file or a link)."""
    if os.path.lexists(final):
        raise FileExistsError(f"{final} already exists; not replaced")
    os.chmod(tmp, 0o777 & ~_umask())
    os.rename(tmp, final)


def is_real_dir(path: str) -> bool:
    """A directory that is not a symbolic link."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_tree(path: str) -> bool:
    """Remove ``path`` if it is a real directory (never a link, never through one: the
    removal works on file descriptors); returns whether it was removed."""
    if not is_real_dir(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def read_small_text(path: str, limit: int = 4096) -> str:
    """The text of the regular file ``path`` (at most ``limit`` bytes), opened without
    following a link. Raises OSError (ELOOP for a link) or ValueError (not a regular file,
    too long, not UTF-8)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"longer than {limit} bytes")
    return data.decode("utf-8")


def temp_prefix(name: str) -> str:
    """``.<name>.`` for a temporary beside file ``name``, cut to 200 bytes of the name so
    that the random part and ``.tmp`` fit a file name's 255 bytes."""
    raw = os.fsencode(name)[:200]
    for cut in range(4):  # (not through a UTF-8 character)
        try:
            raw[:len(raw) - cut].decode()
        except UnicodeDecodeError:
            continue
        raw = raw[:len(raw) - cut]
        break
    return "." + os.fsdecode(raw) + "."


def new_temp_file(path: str) -> str:
    """A fresh empty file ``.<name>.<random>.tmp`` beside ``path`` (created exclusively,
    mode 0600), to be written and then published with ``publish_file``."""
    d, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(base), suffix=".tmp", dir=d)
    os.close(fd)
    return tmp


# What check_output let be written at each path: its identity then (None: nothing there).
_APPROVED: dict[str, tuple | None] = {}


def identity(path: str) -> tuple | None:
    """(device, inode, size, modification time) of the name ``path`` itself (a link is not
    followed), None if nothing is there."""
    try:
        return file_stamp(os.lstat(path))
    except FileNotFoundError:
        return None


def file_stamp(st: os.stat_result) -> tuple:
    """A file's identity and state: (device, inode, size, modification time in ns)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def approved(path: str) -> tuple | None:
    """What ``check_output`` saw at ``path`` (``identity``), or what is there now if it
    did not look: what publishing may replace."""
    return _APPROVED.get(os.path.abspath(path), identity(path))


class OutputChanged(FileExistsError):
    """The output's name changed hands while the command ran: nothing was replaced."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def publish_as(tmp: str, path: str, was: tuple | None) -> None:
    """Rename ``tmp`` to ``path`` if the name still holds what it held when the command
    checked it, ``was`` (``identity``; None: nothing), else raise ``OutputChanged`` (another
    process wrote or replaced it meanwhile: its file stays). A new name is taken atomically
    (no rename over a file that appears at the last moment); a link is replaced, never
    followed."""
    if identity(path) != was:
        raise OutputChanged(17, "another process wrote it while this command ran: "
                                "not replaced (choose another name)", path)
    if was is not None:
        os.replace(tmp, path)
    elif not _rename_new(tmp, path):
        raise OutputChanged(17, "another process wrote it at the same moment: not "
                                "replaced (choose another name)", path)
    _APPROVED[os.path.abspath(path)] = identity(path)


def _rename_new(tmp: str, path: str) -> bool:
    """Rename ``tmp`` to the new name ``path``; False if something took the name first.
    Linux's renameat2(RENAME_NOREPLACE), else a hard link, else a check then a rename."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rename2 = getattr(libc, "renameat2", None)
    if rename2 is not None:  # (AT_FDCWD = -100, RENAME_NOREPLACE = 1)
        if rename2(-100, os.fsencode(tmp), -100, os.fsencode(path), 1) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), path)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # (no hard links here)
        if os.path.lexists(path):
            return False
        os.rename(tmp, path)
        return True
    os.unlink(tmp)
    return True


def publish_file(tmp: str, path: str, was: tuple | None) -> None:
    """Give ``tmp`` the usual permissions and publish it as ``path`` (``publish_as``)."""
    os.chmod(tmp, 0o666 & ~_umask())
    publish_as(tmp, path, was)


@contextlib.contextmanager
def atomic_output(path: str):
    """``with atomic_output(out) as tmp:`` write the file ``tmp`` (a fresh unique name beside
    ``out``); on success it is renamed to ``out`` (replacing a link there, never following
    it) if ``out`` still holds what ``check_output`` saw there (else ``OutputChanged``); on
    any error it is removed, so a failed write leaves no partial file and an existing
    ``out`` unchanged."""
    was = approved(path)
    tmp = new_temp_file(path)
    try:
        yield tmp
        publish_file(tmp, path, was)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def nearest_existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists (absolute)."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def check_writable_dir(path: str, deepest: str = "") -> str | None:
    """Why files cannot be created in directory ``path`` (created later if missing), or
    None. Probes the directory, or its nearest existing ancestor, by writing a nameless
    temporary file (removed at once; nothing is left behind). ``deepest``: the longest
    relative path it will hold, whose full path must fit the system's limits."""
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path} exists and is not a directory"
    base = nearest_existing(path)
    if not os.path.isdir(base):
        return f"{base} is not a directory, so {path} cannot be created"
    too_long = _too_long(path, os.path.join(path, deepest), base)
    if too_long:
        return too_long
    try:
        with tempfile.TemporaryFile(dir=base) as f:
            f.write(b"\0" * _PROBE_BYTES)
            f.flush()
    except OSError as e:
        what = "cannot be created" if base != os.path.abspath(path) else "is not writable"
        return f"{path} {what} ({base}: {e.strerror or e})"
    return None


def _too_long(path: str, full: str, base: str) -> str | None:
    """Why ``full`` (a path under directory ``path``; ``base``: its nearest existing
    ancestor) is longer than the filesystem takes (PATH_MAX, or a name over NAME_MAX)."""
    def conf(name: str, default: int) -> int:
        try:
            return os.pathconf(base, name) or default
        except (OSError, ValueError):
            return default

    n, limit, name_max = len(os.fsencode(os.path.abspath(full))), conf(  # (written so)
        "PC_PATH_MAX", 4096), conf("PC_NAME_MAX", 255)
    if n >= limit:
        return (f"{path}: the files it will hold have paths of {n} bytes, over the {limit - 1} "
                "this system takes (PATH_MAX): choose a shorter path")
    long = next((c for c in full.split(os.sep) if len(os.fsencode(c)) > name_max), None)
    return None if long is None else (
        f"{path}: the name {long[:40]}... is {len(os.fsencode(long))} bytes, over the "
        f"{name_max} a name may have here (NAME_MAX)")


def check_writable_file(path: str) -> str | None:
    """Why the file ``path`` cannot be written (it will be created or replaced), or None.
    An existing file is opened for appending (not modified); its directory is probed."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        return f"directory {os.path.dirname(path) or d} does not exist"
    if os.path.lexists(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            os.close(fd)
        except OSError as e:
            return f"{path} is not writable ({e.strerror or e})"
    problem = check_writable_dir(d)
    return None if problem is None else f"{path}: {problem}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def room_problem(directory: str, total: int, biggest: int) -> str | None:
    """Why ``total`` bytes, the largest file ``biggest``, cannot be written in
    ``directory``: less free space on its disk (``statvfs``), or a file size limit
    (``ulimit -f``); None if neither. Checked before HDF5 writes: h5py writing into a full
    disk can crash the process instead of raising."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and biggest > limit:
        return (f"a file of about {_size(biggest)} exceeds the file size limit (ulimit -f) "
                f"of {_size(limit)} (File too large)")
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if total > free:
        return (f"about {_size(total)} is needed, its disk has {_size(free)} free "
                "(No space left on device)")
    return None


# -- the output guard --------------------------------------------------------------------------

def same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same device and inode (also through
    links and hard links), or, for names not created yet, the same resolved path."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _is_checkpoint_dir(d: str) -> bool:
    """A directory pshybrid wrote checkpoints in (a ``latest`` holding ``step-N``, or a
    ``step-N`` directory with a ``meta.json``), or one such ``step-N`` directory."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    if STEP_RE.fullmatch(os.path.basename(d)) and "meta.json" in names:
        return True
    if "latest" in names:
        with contextlib.suppress(OSError, ValueError):
            if STEP_RE.fullmatch(read_small_text(os.path.join(d, "latest"), 256).strip()):
                return True
    return any(STEP_RE.fullmatch(n) and os.path.isfile(os.path.join(d, n, "meta.json"))
               for n in names)


def checkpoint_holding(path: str, also=()) -> str | None:
    """The checkpoint directory ``path`` lies in (its own directory or any above it, once
    links are resolved), or the directory of ``also`` (a run's ``--checkpoint-dir``, which may
    be empty yet) that holds it; None if neither."""
    p = os.path.realpath(path)
    for d in also:
        root = os.path.realpath(d)
        if p == root or p.startswith(root.rstrip(os.sep) + os.sep):
            return d
    d = os.path.dirname(p)
    while True:
        if _is_checkpoint_dir(d):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def h5_file(path: str, mode: str = "r"):
    """``h5py.File(path, mode)`` on any filesystem. A file this process creates (``w``, ``x``:
    a temporary or a checkpoint's file, which no other process opens) skips HDF5's file
    lock; a file read is locked as HDF5 does, and read without its lock where the filesystem
    has no locks (an NFS mount without its lock daemon: the lock fails with an error, not
    EWOULDBLOCK), which failed every read and, after the last step, every checkpoint."""
    import h5py

    if mode != "r":
        return h5py.File(path, mode, locking=False)
    try:
        return h5py.File(path, mode)
    except OSError as e:
        held = re.search(r"unable to lock file, errno = (\d+)", str(e))
        if held is None or int(held.group(1)) in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise  # (not a lock; or another process holds it: it writes the file)
        return h5py.File(path, mode, locking=False)


def output_kind(path: str) -> str | None:
    """The command that wrote the HDF5 file ``path`` (its ``OUTPUT_ATTR``), or None."""
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != b"\x89HDF\r\n\x1a\n":
                return None
        with h5_file(path) as f:
            kind = f.attrs.get(OUTPUT_ATTR)
    except (OSError, ValueError, ImportError):
        return None
    return kind.decode() if isinstance(kind, bytes) else kind


def check_output(path: str, option: str, inputs=(), checkpoint_dirs=(),
                 existing=None) -> str | None:
    """Why the command may not write its output ``path`` (named ``option`` in the message),
    or None. Refused: an existing name that is not a regular file; the same file as one of
    ``inputs`` ``(name, path)``; a path inside a checkpoint directory (``checkpoint_holding``,
    ``checkpoint_dirs``: the run's own). ``existing(path)``, called for an existing regular
    file, says why it may not be replaced (None: it may)."""
    name = f"{option} {path}" if option else path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return f"{name}: {e.strerror or e}"
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        return (f"{name} is {what}: an output is a regular file or a new name (a device, FIFO "
                "or directory is never replaced)")
    for what, other in inputs:
        if other and same_file(path, other):
            return f"{name} is the same file as {what} {other}: an input is never written over"
    ck = checkpoint_holding(path, checkpoint_dirs)
    if ck is not None:
        return (f"{name} lies inside the checkpoint directory {ck}: write outputs elsewhere "
                "(a checkpoint's files are never written over)")
    why = existing(path) if st is not None and existing is not None else None
    if why is None:
        _APPROVED[os.path.abspath(path)] = identity(path)
    return why


def replaceable(command: str, overwrite: bool):
    """``existing`` for ``check_output``: an existing output is refused without ``overwrite``,
    and with it unless ``output_kind`` is ``command`` (an earlier output of that command)."""
    def why(path: str) -> str | None:
        if not overwrite:
            python = " (from Python: overwrite=True)" if command in ("export", "predict") else ""
            return (f"{path} exists; pass --overwrite{python} to replace an earlier output of "
                    f"{command}")
        if output_kind(path) != command:
            return (f"{path} exists and is not an output of pshybrid {command} (no "
                    f"{OUTPUT_ATTR} = {command!r} attribute): not replaced, even with "
                    "--overwrite; remove it yourself or choose another name")
        return None
    return why
