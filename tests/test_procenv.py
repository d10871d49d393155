"""What a command starts with, as a batch system or a shell leaves it (``pshybrid.procenv``):
closed or failing standard streams, a working directory removed under the job, numba's
interpreter mode. Each case ran into a traceback or a wrong exit status before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mpi_util import JOB_TIMEOUT, pshybrid
from pshybrid.checkpoint_files import read_latest


def _run(args, tmp_path, close=(), env=None, stdout=subprocess.PIPE):
    """``args`` in ``tmp_path`` with the descriptors ``close`` closed, as ``cmd >&-``
    leaves them."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (a user's)
    return subprocess.run(args, cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=JOB_TIMEOUT, env=dict(base, **(env or {})),
                          preexec_fn=lambda: [os.close(fd) for fd in close])


def test_a_closed_descriptor_is_reopened_before_any_file_takes_its_number(tmp_path):
    code = ("import os, sys\nfrom pshybrid import procenv\nprocenv.reopen_closed()\n"
            f"fd = os.open({str(tmp_path / 'f')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "print(fd, sys.stdout is not None, sys.stdin.read() == '', file=sys.stderr)\n")
    r = _run([sys.executable, "-c", code], tmp_path, close=(0, 1))
    assert r.returncode == 0, r.stderr
    fd, has_stdout, empty_stdin = r.stderr.split()
    assert int(fd) > 2 and has_stdout == "True" and empty_stdin == "True", r.stderr


def test_closed_standard_streams_keep_the_documented_statuses(tmp_path):
    """stdout closed: train and info run (they died on a None stdout); stderr closed: a bad
    option is still status 2 (1: the error line's write raised); stdin closed under ``-``:
    no data rows, status 2 (a traceback)."""
    r = _run(pshybrid("train", "--mode", "allreduce", "--steps", "3", "--checkpoint-dir",
                      "ck"), tmp_path, close=(1,))
    assert r.returncode == 0 and read_latest(str(tmp_path / "ck")) == "step-3", r.stderr
    assert _run(pshybrid("info"), tmp_path, close=(1,)).returncode == 0
    assert _run(pshybrid("train", "--steps", "-1"), tmp_path, close=(2,)).returncode == 2
    r = _run(pshybrid("prep", "criteo", "-", "o.h5"), tmp_path, close=(0,))
    assert r.returncode == 2 and r.stderr.strip() == "pshybrid: error: <stdin>: no data rows", \
        r.stderr
    assert not (tmp_path / "o.h5").exists()


def test_a_full_standard_output_is_one_warning_and_status_1_with_the_work_done(tmp_path):
    """stdout on a full disk (/dev/full): the run goes on, its checkpoint and outputs are
    written, one warning says why the status is 1 (a traceback, and train stopped; with
    Python's buffering, 120 from the interpreter's exit), ``--help``'s too."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = _run(pshybrid("train", "--mode", "allreduce", "--steps", "5", "--checkpoint-dir",
                          "ck"), tmp_path, stdout=full)
        p = _run(pshybrid("prep", "synthetic", "o.h5", "--rows", "100"), tmp_path, stdout=full)
        h = _run(pshybrid("prep", "synthetic", "--help"), tmp_path, stdout=full)
    for done in (r, p, h):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("pshybrid: warning: cannot write to standard output "
                                   "(No space left on device)"), lines
    assert read_latest(str(tmp_path / "ck")) == "step-5"
    assert (tmp_path / "o.h5").is_file()


def test_a_working_directory_removed_under_the_job(tmp_path):
    """Absolute paths: the run's checkpoints are written as ever, and record the directory
    it started in (``getcwd`` at each save failed them all). Relative ones: one line,
    status 2 (a traceback)."""
    start = tmp_path / "start"
    code = textwrap.dedent(f"""
        import os, sys
        os.chdir({str(start)!r})
        from pshybrid import cli, launch

        def removed_then_main(argv):  # (after launch.run noted the start)
            os.rmdir({str(start)!r})
            return cli.main(argv)

        sys.exit(launch.run(removed_then_main, sys.argv[1:]))
    """)
    for args, status in ((["train", "--mode", "allreduce", "--steps", "4",
                           "--checkpoint-every", "2", "--checkpoint-dir",
                           str(tmp_path / "ck")], 0),
                         (["prep", "synthetic", "o.h5", "--rows", "100"], 2)):
        start.mkdir()
        r = _run([sys.executable, "-c", code, *args], tmp_path)
        assert r.returncode == status, r.stderr
    assert read_latest(str(tmp_path / "ck")) == "step-4"
    for step in (2, 4):
        meta = json.loads((tmp_path / "ck" / f"step-{step}" / "meta.json").read_text())
        assert meta["cwd"] == str(start)
    assert r.stderr.strip() == ("pshybrid: error: No such file or directory: the working "
                                "directory was removed: give absolute paths, or start in a "
                                "directory that stays"), r.stderr


def test_numba_in_interpreter_mode_trains_as_the_compiled_kernels(tmp_path):
    """``NUMBA_DISABLE_JIT=1`` (numba's debugging switch): train ran into an AttributeError
    at its banner; now it trains, step for step as the compiled kernels do."""
    assert _run(pshybrid("prep", "synthetic", "d.h5", "--rows", "1000", "--max-cardinality",
                         "500"), tmp_path).returncode == 0  # (small tables: interpreted)
    losses = []
    for disable in ("0", "1"):
        m = tmp_path / f"m{disable}.jsonl"
        r = _run(pshybrid("train", "--mode", "allreduce", "--steps", "3", "--data", "d.h5",
                          "--metrics", str(m)),
                 tmp_path, env={"NUMBA_DISABLE_JIT": disable, "PYTHONWARNINGS": "ignore"})
        assert r.returncode == 0, r.stderr
        losses.append([json.loads(line)["loss"] for line in m.read_text().splitlines()
                       if '"loss"' in line])
    assert losses[0] and losses[1] == pytest.approx(losses[0], rel=1e-6), losses


def test_a_read_only_output_directory_is_said_before_any_work(tmp_path, monkeypatch):
    """prep's and export's output directory on a read-only file system: one line naming it,
    before the checkpoint is read (export wrote its temporary, then said the raw OSError;
    prep said 'permission denied')."""
    import errno

    from pshybrid import PshybridError, export, safeio
    from pshybrid.cli import main

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(safeio.tempfile, "TemporaryFile", read_only)
    said = f"{tmp_path} is not writable ({tmp_path}: {os.strerror(errno.EROFS)})"
    with pytest.raises(PshybridError) as e:
        export.export(str(tmp_path / "no-checkpoint"), str(tmp_path / "e.h5"))
    assert str(e.value) == f"export: {tmp_path / 'e.h5'}: {said}"
    with pytest.raises(PshybridError) as e:
        main(["prep", "synthetic", str(tmp_path / "p.h5"), "--rows", "10"])
    assert str(e.value) == f"OUT {tmp_path / 'p.h5'}: {said}"
    assert os.listdir(tmp_path) == []
