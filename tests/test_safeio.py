"""File primitives never write, read or remove through a link someone planted
(``pshybrid/safeio.py``), and failed writes leave nothing behind."""

import os

import pytest

from pshybrid import safeio


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

    return f"{host or socket.gethostname()} {pid} {start or safeio._start_time(pid)}\n"


def test_dir_lock_is_exclusive_and_judges_stale_holders(tmp_path, monkeypatch):
    """Oracle: a live holder on this host (this test's own parent process) and a holder on
    another host are refused, naming them; a holder whose pid is gone or was reused (another
    start time), or the same batch job's earlier run (a requeue, on another node), is
    stale: taken over with a notice naming it."""
    import subprocess
    import sys

    for var in (*safeio.BATCH_JOB_VARS, "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "ck"
    lock = safeio.DirLock(str(root))
    assert lock.acquire() is None and root.is_dir()
    with pytest.raises(FileExistsError, match=f"pid {os.getpid()} on host"):
        safeio.DirLock(str(root)).acquire()
    lock.release()
    assert not root.exists()  # it made the directory and nothing else was written there
    root.mkdir()
    path = root / safeio.LOCK_NAME
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
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
            safeio.DirLock(str(root)).acquire()
        assert str(path) in str(e.value) and path.read_text() == text
    stale[_lock_text(1, host="elsewhere").strip() + " 42#0\n"] = "earlier run of batch job 42"
    for text, why in stale.items():
        path.write_text(text)
        lock = safeio.DirLock(str(root))
        notice = lock.acquire()
        assert why in notice and str(path) in notice and path.read_text() == lock.mine
        lock.release()
        assert os.listdir(root) == []
