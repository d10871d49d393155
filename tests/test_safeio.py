"""File primitives never write, read or remove through a link someone planted
(``pshybrid/safeio.py``), and failed writes leave nothing behind."""

import os

import pytest

from pshybrid import dirlock, safeio


def victim(tmp_path, text="precious\n"):
    v = tmp_path / "victim.txt"
    v.write_text(text)
    return v


def test_atomic_write_text_replaces_links_never_follows_them(tmp_path):
    v = victim(tmp_path)
    d = tmp_path / "ck"
    d.mkdir()
    for name in ("latest", "latest.tmp", ".latest.tmp"):  # at the target and at fixed temp names
        os.symlink(v, d / name)
    safeio.atomic_write_text(str(d / "latest"), "step-3\n")
    assert v.read_text() == "precious\n"
    assert not os.path.islink(d / "latest") and (d / "latest").read_text() == "step-3\n"
    assert sorted(os.listdir(d)) == [".latest.tmp", "latest", "latest.tmp"]  # no temp left


def test_atomic_output_removes_its_temporary_on_error(tmp_path):
    out = tmp_path / "out.h5"
    with pytest.raises(RuntimeError):
        with safeio.atomic_output(str(out)) as tmp:
            open(tmp, "w").write("partial")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_atomic_output_replaces_a_link_at_the_output(tmp_path):
    v = victim(tmp_path)
    out = tmp_path / "out.h5"
    os.symlink(v, out)
    with safeio.atomic_output(str(out)) as tmp:
        open(tmp, "w").write("new")
    assert v.read_text() == "precious\n" and out.read_text() == "new" and not out.is_symlink()


@pytest.mark.parametrize("fallback", ["renameat2", "link", "check"])
def test_an_output_that_appears_or_changes_while_the_command_runs_is_never_replaced(
        tmp_path, monkeypatch, fallback):
    """Oracle: the user's file, byte for byte. A file written at the output's name after the
    command checked it (another prep, predict or export; an editor) stays, the command
    fails naming it, and no temporary is left; before, the rename replaced it. Each way of
    taking a new name (renameat2, a hard link, a check then a rename) refuses it."""
    import ctypes

    if fallback != "renameat2":  # (a libc without renameat2, then a filesystem without links)
        monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: object())
    if fallback == "check":
        monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(PermissionError()))
    out = tmp_path / "out.h5"
    assert safeio.check_output(str(out), "OUT") is None  # nothing there: a new name
    with pytest.raises(safeio.OutputChanged, match="another process wrote it"):
        with safeio.atomic_output(str(out)) as tmp:
            open(tmp, "w").write("mine")
            out.write_text("precious\n")  # appears meanwhile
    assert out.read_text() == "precious\n" and os.listdir(tmp_path) == ["out.h5"]
    seen = safeio.identity  # ... and at the last moment, after the name was found free:
    monkeypatch.setattr(safeio, "identity", lambda p: None if p == str(out) else seen(p))
    with pytest.raises(safeio.OutputChanged, match="at the same moment"):
        with safeio.atomic_output(str(out)) as tmp:
            open(tmp, "w").write("mine")
    monkeypatch.setattr(safeio, "identity", seen)
    assert out.read_text() == "precious\n" and os.listdir(tmp_path) == ["out.h5"]
    assert safeio.check_output(str(out), "OUT", existing=lambda p: None) is None  # approved
    with pytest.raises(safeio.OutputChanged):
        with safeio.atomic_output(str(out)) as tmp:
            open(tmp, "w").write("mine")
            (tmp_path / "other").write_text("another\n")
            os.replace(tmp_path / "other", out)  # replaced by another file meanwhile
    assert out.read_text() == "another\n" and os.listdir(tmp_path) == ["out.h5"]
    fresh = tmp_path / "fresh.h5"
    with safeio.atomic_output(str(fresh)) as tmp:
        open(tmp, "w").write("mine")
    assert fresh.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["fresh.h5", "out.h5"]


def test_a_temporary_fits_a_file_name_however_long_the_output_name(tmp_path):
    """A 250-byte output name (the limit is 255): export wrote all its data, then failed to
    make ``.<name>.<random>.tmp``; multi-byte names are cut between characters."""
    for name in ("x" * 250 + ".h5", "é" * 125 + ".h5"):
        out = tmp_path / name
        with safeio.atomic_output(str(out)) as tmp:
            assert len(os.fsencode(os.path.basename(tmp))) <= 255
            open(tmp, "w").write("ok")
        assert out.read_text() == "ok"


def test_remove_tree_never_goes_through_a_link(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("x")
    os.symlink(keep, tmp_path / "step-1")
    assert not safeio.remove_tree(str(tmp_path / "step-1"))
    assert (keep / "f").read_text() == "x" and os.path.islink(tmp_path / "step-1")
    real = tmp_path / "step-2"
    real.mkdir()
    os.symlink(keep, real / "inner")  # a link inside is removed, not followed
    assert safeio.remove_tree(str(real)) and (keep / "f").exists()


def test_publish_dir_never_replaces_anything(tmp_path):
    tmp = safeio.make_temp_dir(str(tmp_path), ".step-1.")
    os.symlink(tmp_path / "elsewhere", tmp_path / "step-1")
    with pytest.raises(FileExistsError):
        safeio.publish_dir(tmp, str(tmp_path / "step-1"))


def test_read_small_text_refuses_links_and_non_files(tmp_path):
    v = victim(tmp_path, "step-1\n")
    os.symlink(v, tmp_path / "latest")
    with pytest.raises(OSError):
        safeio.read_small_text(str(tmp_path / "latest"))
    with pytest.raises((OSError, ValueError)):
        safeio.read_small_text(str(tmp_path))
    assert safeio.read_small_text(str(v)) == "step-1\n"


def test_writable_checks_name_the_problem_and_create_nothing(tmp_path):
    v = victim(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert safeio.check_writable_dir(str(tmp_path / "new" / "ck")) is None
    assert "not a directory" in safeio.check_writable_dir(str(v / "ck"))
    assert "not a directory" in safeio.check_writable_dir(str(v))
    assert "does not exist" in safeio.check_writable_file(str(tmp_path / "no" / "m.jsonl"))
    assert "is a directory" in safeio.check_writable_file(str(tmp_path))
    assert safeio.check_writable_file(str(v)) is None and v.read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == before


def test_a_checkpoint_dir_whose_files_would_not_fit_path_max_is_refused_first(tmp_path):
    """A 4,070-byte --checkpoint-dir passed the checks and failed at the first checkpoint
    (ENAMETOOLONG on .step-10.<random>.tmp/dense.h5), after the work; a name over NAME_MAX
    too. Oracle: the system's own refusal of the same path."""
    deep = os.path.join(".step-99.abcdefgh.tmp", "shard-00000.h5")
    long, target = str(tmp_path), os.pathconf(tmp_path, "PC_PATH_MAX") - 20  # (fits alone)
    while len(long) + 201 < target:
        long = os.path.join(long, "d" * 200)
    long = os.path.join(long, "e" * (target - len(long) - 1))
    assert safeio.check_writable_dir(long) is None  # (the directory's own name fits)
    assert "PATH_MAX" in safeio.check_writable_dir(long, deep)
    with pytest.raises(OSError, match="too long"):
        os.makedirs(os.path.join(long, os.path.dirname(deep)))
    assert "NAME_MAX" in safeio.check_writable_dir(str(tmp_path / ("n" * 256)), deep)
    assert safeio.check_writable_dir(str(tmp_path / "ck"), deep) is None


def _checkpoint(tmp_path):
    """ck/ as pshybrid lays it out: latest -> step-2 (meta.json, dense.h5)."""
    ck = tmp_path / "ck"
    (ck / "step-2").mkdir(parents=True)
    (ck / "step-2" / "meta.json").write_text("{}")
    (ck / "step-2" / "dense.h5").write_bytes(b"x")
    (ck / "latest").write_text("step-2\n")
    return ck


def test_check_output_refuses_inputs_checkpoints_and_special_files(tmp_path):
    """Oracle: each output below would destroy something (an input by another name, a
    checkpoint's file, a device node or FIFO); a new name beside them is allowed."""
    data = victim(tmp_path)
    os.link(data, tmp_path / "hard.txt")
    os.symlink(data, tmp_path / "soft.txt")
    os.mkfifo(tmp_path / "fifo")
    ck = _checkpoint(tmp_path)
    inputs = [("--data", str(data))]
    refused = {str(tmp_path / "hard.txt"): "same file as --data",
               str(tmp_path / "soft.txt"): "same file as --data",
               str(tmp_path / "sub" / ".." / "victim.txt"): "same file as --data",
               str(ck / "latest"): "inside the checkpoint directory",
               str(ck / "step-2" / "dense.h5"): "inside the checkpoint directory",
               str(ck / "step-2" / "new.h5"): "inside the checkpoint directory",
               str(tmp_path / "fifo"): "not a regular file",
               os.devnull: "not a regular file",
               str(tmp_path): "is a directory"}
    (tmp_path / "sub").mkdir()
    for out, why in refused.items():
        problem = safeio.check_output(out, "--out", inputs)
        assert problem and why in problem and out in problem, (out, problem)
    fresh = tmp_path / "run" / "m.jsonl"  # inside the run's own --checkpoint-dir, not made yet
    assert "inside the checkpoint directory" in safeio.check_output(
        str(fresh), "--metrics", checkpoint_dirs=[str(tmp_path / "run")])
    assert safeio.check_output(str(tmp_path / "new.h5"), "--out", inputs) is None
    assert open(data).read() == "precious\n" and os.path.isfile(ck / "latest")


def test_overwrite_replaces_only_an_earlier_output_of_the_same_command(tmp_path):
    import h5py

    mine, other, text = tmp_path / "mine.h5", tmp_path / "other.h5", victim(tmp_path)
    for path, kind in ((mine, "export"), (other, "predict")):
        with h5py.File(path, "w") as f:
            f.attrs[safeio.OUTPUT_ATTR] = kind
    export = safeio.replaceable("export", overwrite=True)
    assert safeio.check_output(str(mine), "", existing=export) is None
    for path in (other, text):
        assert "not an output of pshybrid export" in safeio.check_output(
            str(path), "", existing=export)
    assert "--overwrite" in safeio.check_output(
        str(mine), "", existing=safeio.replaceable("export", overwrite=False))


def _lock_text(pid, start=None, host=None):
    import socket

    return f"{host or socket.gethostname()} {pid} {start or dirlock._start_time(pid)}\n"


def test_dir_lock_is_exclusive_and_judges_stale_holders(tmp_path, monkeypatch):
    """Oracle: a live holder on this host (this test's own parent process) and a holder on
    another host are refused, naming them; a holder whose pid is gone or was reused (another
    start time), or the same batch job's earlier run (a requeue, on another node), is
    stale: taken over with a notice naming it."""
    import subprocess
    import sys

    for var in (*dirlock.BATCH_JOB_VARS, "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "ck"
    lock = dirlock.DirLock(str(root))
    assert lock.acquire() is None and root.is_dir()
    with pytest.raises(FileExistsError, match=f"pid {os.getpid()} on host"):
        dirlock.DirLock(str(root)).acquire()
    lock.release()
    assert not root.exists()  # it made the directory and nothing else was written there
    root.mkdir()
    path = root / dirlock.LOCK_NAME
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    refused = {_lock_text(os.getppid()): "in use by another job",
               _lock_text(1, host="elsewhere"): "on host elsewhere",
               _lock_text(1, host="elsewhere").strip() + " 41#0\n": "on host elsewhere",
               _lock_text(1, host="elsewhere").strip() + " 42#1\n": "on host elsewhere"}
    stale = {_lock_text(gone, start="1"): "which is gone",
             _lock_text(os.getppid(), start="1"): "now another process"}
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # this run: batch job 42, requeued once (its
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # id stays; another run: other id or count)
    for text, why in refused.items():
        path.write_text(text)
        with pytest.raises(FileExistsError, match=why) as e:
            dirlock.DirLock(str(root)).acquire()
        assert str(path) in str(e.value) and path.read_text() == text
    stale[_lock_text(1, host="elsewhere").strip() + " 42#0\n"] = "earlier run of batch job 42"
    for text, why in stale.items():
        path.write_text(text)
        lock = dirlock.DirLock(str(root))
        notice = lock.acquire()
        assert why in notice and str(path) in notice and path.read_text() == lock.mine
        lock.release()
        assert os.listdir(root) == []


def test_dir_lock_held_by_a_process_this_host_cannot_see_is_refused(tmp_path, monkeypatch):
    """Oracle: the holder's flock. A holder in another PID namespace (a container; here: a
    lock naming a pid that is gone, while another process holds the file's flock) and one
    that /proc hides (hidepid: alive, start time unknown) are refused, not taken over as
    "gone" or "another process", which let a second job write into a running job's
    checkpoints. Once the flock's process ends, the same lock is stale."""
    import subprocess
    import sys

    for var in (*dirlock.BATCH_JOB_VARS, "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "ck"
    root.mkdir()
    path = root / dirlock.LOCK_NAME
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    path.write_text(_lock_text(gone, start="1"))
    holder = subprocess.Popen(  # holds the flock as a live holder does, then waits
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert dirlock.flock_held(str(path)) is True
        with pytest.raises(FileExistsError, match="in use by another job"):
            dirlock.DirLock(str(root)).acquire()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert dirlock.flock_held(str(path)) is False
    path.write_text(_lock_text(os.getppid()))
    monkeypatch.setattr(dirlock, "_start_time", lambda pid: None)  # /proc hides it
    with pytest.raises(FileExistsError, match="start time cannot be read"):
        dirlock.DirLock(str(root)).acquire()
    monkeypatch.undo()
    path.write_text(_lock_text(gone, start="1"))
    lock = dirlock.DirLock(str(root))
    assert "which is gone" in lock.acquire()
    assert dirlock.flock_held(str(path)) is True  # the new holder's own flock
    lock.release()
    assert os.listdir(root) == [] and lock.fd is None


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
def test_hdf5_files_are_read_and_written_where_the_filesystem_has_no_locks(tmp_path):
    """Oracle: the same commands' results with and without locks. An NFS mount without its
    lock daemon (emulated: flock() fails with ENOLCK, through LD_PRELOAD) made every
    dataset "not a readable HDF5 file (unable to lock file, errno = 37)" and failed the
    checkpoint after the last step, losing the run; HDF5's own switch for it,
    HDF5_USE_FILE_LOCKING=FALSE, was named nowhere."""
    import shutil
    import subprocess
    import sys

    import h5py
    import numpy as np

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the flock() stand-in")
    shim = tmp_path / "noflock.so"
    (tmp_path / "noflock.c").write_text(
        "#include <errno.h>\nint flock(int fd, int op) { errno = 37; return -1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "noflock.c")],
                   check=True, timeout=60)
    env = dict(os.environ, LD_PRELOAD=str(shim))
    small = ["--mode", "allreduce", "--servers", "0", "--embedding-dim", "4", "--mlp", "8",
             "--batch-size", "16", "--steps", "3", "--progress", "none"]

    def pshybrid(*args, locks):
        p = subprocess.run([sys.executable, "-m", "pshybrid", *args], cwd=tmp_path, timeout=300,
                           env=env if not locks else None, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return p

    for locks in (True, False):
        tag = "locks" if locks else "none"
        pshybrid("prep", "synthetic", "--rows", "500", f"d-{tag}.h5", locks=locks)
        pshybrid("train", "--data", f"d-{tag}.h5", *small, "--checkpoint-dir", f"ck-{tag}",
                 locks=locks)
        pshybrid("export", f"ck-{tag}", f"e-{tag}.h5", locks=locks)
    with h5py.File(tmp_path / "e-locks.h5") as a, h5py.File(tmp_path / "e-none.h5") as b:
        names = []
        a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
        assert any(n.startswith("embeddings/") for n in names), names
        for n in names:
            np.testing.assert_array_equal(a[n][...], b[n][...], err_msg=n)


def test_dir_lock_that_cannot_be_written_leaves_nothing_and_an_empty_free_one_is_stale(
        tmp_path, monkeypatch):
    """A lock whose text could not be written (a full disk) was left empty, its descriptor
    open, and refused every later run ("names no holder: remove it"). Now it is removed; an
    empty lock that no process holds (its holder ended between making and writing it) is
    stale, and one a process holds is in use."""
    import errno

    root = tmp_path / "ck"
    root.mkdir()
    path = root / dirlock.LOCK_NAME
    fds = len(os.listdir("/proc/self/fd"))
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        dirlock.DirLock(str(root)).acquire()
    monkeypatch.setattr(os, "write", real_write)
    assert not path.exists() and len(os.listdir("/proc/self/fd")) == fds
    path.write_text("")  # empty, nobody holding it
    lock = dirlock.DirLock(str(root))
    assert "no holder named, and none holding it" in lock.acquire()
    lock.release()
    path.write_text("")
    import fcntl

    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # (another open file description: "another process")
        with pytest.raises(FileExistsError, match="a process holds it"):
            dirlock.DirLock(str(root)).acquire()
