"""Whole-job failure behaviour: a job fails loudly and fast, never silently, and never
leaves a broken checkpoint behind."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest

from mpi_util import mpiexec, pshybrid, run_job

pytestmark = pytest.mark.job
SMALL = ["--batch-size", "16", "--embedding-dim", "4", "--mlp", "16", "--log-every", "5"]


def test_rank_raising_mid_training_ends_job_fast():
    """The abort leaves none of the job's shared memory in /dev/shm. Time from the failing
    rank's report to the end of the whole job (start-up, which includes numba's first
    compile in a fresh environment, is not counted)."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_with_fault.py")
    cmd = [mpiexec(), "-n", "4", sys.executable, script, "1", "7", "--steps", "200", *SMALL]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    lines, t_fault = [], None
    try:
        deadline = time.time() + 120
        for line in proc.stderr:  # ends when every rank is gone
            lines.append(line)
            if t_fault is None and "injected fault" in line:
                t_fault = time.time()
            assert time.time() < deadline, "job hung"
        proc.wait(timeout=30)
        t_end = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(lines)
    assert proc.returncode != 0
    assert "rank 1/4" in err and "injected fault" in err and "at step 7" in err, err
    assert t_fault is not None and t_end - t_fault < 10, f"{t_end - t_fault:.1f}s"
    shm = [ln.split()[2:] for ln in lines if ln.startswith("shared memory:")]
    assert shm, err  # the job's named segments on this node (MPICH 4.2 unlinks them at once:
    assert not [p for p in shm[0] if os.path.exists(p)], shm  # none), none left behind


def test_the_holder_raising_releases_the_checkpoint_directory_lock(tmp_path):
    """Worker 0 (world rank 0, which holds --checkpoint-dir's lock) raises alone: the lock
    is released as the exception leaves train, before the abort (docs/checkpoints.md; an
    error on another rank kills worker 0 holding it, for the next run to take over).
    Oracle: the checkpoints written are there, the lock is not."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_with_fault.py")
    ck = tmp_path / "ck"
    p = run_job(3, [sys.executable, script, "0", "4", "--steps", "50", "--checkpoint-dir",
                    str(ck), "--checkpoint-every", "2", *SMALL], timeout=120)
    assert p.returncode != 0 and "injected fault at step 4" in p.stderr, p.stderr
    assert (ck / "step-2").is_dir() and not (ck / ".pshybrid-lock").exists(), \
        sorted(os.listdir(ck))


def test_nan_loss_stops_with_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ck"
    p = run_job(3, pshybrid("train", "--steps", "60", "--checkpoint-dir", str(ckpt),
                            "--checkpoint-every", "1", "--lr", "1e8", "--dense-lr", "1e8",
                            "--sparse-optimizer", "sgd", "--dense-optimizer", "sgd", *SMALL),
                timeout=120)
    assert p.returncode != 0, p.stdout
    assert ("loss is nan" in p.stderr or "loss is inf" in p.stderr or "diverging" in p.stderr
            or "not finite at step" in p.stderr), p.stderr
    latest = (ckpt / "latest").read_text().strip()
    out = tmp_path / "last.h5"
    e = subprocess.run(pshybrid("export", str(ckpt), str(out)), capture_output=True, text=True,
                       timeout=60)
    assert e.returncode == 0, e.stderr
    with h5py.File(out, "r") as f:
        assert f"step-{f.attrs['step']}" == latest
        for group in ("dense", "embeddings"):
            for k in f[group]:
                assert np.isfinite(f[group][k][...]).all(), (latest, group, k)
    print(f"stopped; latest = {latest}")


def test_sigkill_while_checkpointing_keeps_previous_checkpoint(tmp_path):
    """Checkpoints of the default-size tables (~150 MB each with Adagrad state): kill -9
    the whole job while one is being written; `latest` still names a complete one."""
    ckpt = tmp_path / "ck"
    cmd = [mpiexec(), "-n", "3"] + pshybrid("train", "--steps", "100000", "--checkpoint-dir",
                                            str(ckpt), "--checkpoint-every", "3",
                                            "--batch-size", "16", "--log-every", "1000")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    killed_during = None
    try:
        deadline = time.time() + 150
        while time.time() < deadline and killed_during is None:
            if (ckpt / "latest").exists():
                done = (ckpt / "latest").read_text().strip()
                tmps = [d for d in os.listdir(ckpt) if d.startswith(".step-")]
                if tmps and tmps[0] != f".{done}.tmp":
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_during = (tmps[0], done)
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert killed_during, "never caught a checkpoint being written"
    latest = (ckpt / "latest").read_text().strip()
    assert latest == killed_during[1]
    assert (ckpt / latest / "meta.json").exists()
    e = subprocess.run(pshybrid("export", str(ckpt), str(tmp_path / "x.h5")),
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stderr
    with h5py.File(tmp_path / "x.h5", "r") as f:
        assert f"step-{f.attrs['step']}" == latest
    # and a job resumes from it
    r = run_job(3, pshybrid("train", "--resume", str(ckpt), "--steps",
                            str(int(latest[5:]) + 2), "--batch-size", "16"), timeout=120)
    assert r.returncode == 0, r.stderr
    print(f"killed while writing {killed_during[0]}; latest stayed {latest}")


def test_python_api_dataset_raising_on_one_worker_ends_the_job():
    """train() called from a plain script (no launcher): one worker's dataset raises, the
    others (a server among them) are waiting in MPI; the job must end within seconds,
    naming the rank and the error, with a non-zero status."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "api_dataset_raises.py")
    t0 = time.time()
    p = run_job(3, [sys.executable, script], timeout=120)
    assert p.returncode != 0, p.stdout
    assert "rank 1/3" in p.stderr and "flaky storage" in p.stderr, p.stderr
    assert "not reached" not in p.stdout
    assert time.time() - t0 < 60, f"{time.time() - t0:.0f}s"


_RAISING = [(mode, n, case) for mode, n in (("allreduce", 2), ("hybrid", 3))
            for case in ("one", "after", "one 4", "all", "exit")]


@pytest.mark.parametrize("mode,n,case", _RAISING)  # one job each (its own pytest timeout)
def test_a_torch_exception_inside_try_finally_shutdown_ends_the_job(mode, n, case):
    """``try: ... finally: pt.shutdown()`` on the worker that raised ran shutdown's
    collectives while the others stepped: the job hung (allreduce), or a server's assert
    ended it (hybrid); raised after the loop while the others were in pt.shutdown(), their
    census reported the workers out of step (allreduce). Oracle: the exception's traceback,
    a non-zero status, in time; and
    where every worker handles the same exception (or exits alike) the job ends as before:
    status 0 after an early stop handled with shutdown, 3 after sys.exit(3). With
    pt.init(timeout=4), below shutdown's 30 s wait for the others, the exception still ends
    the job (the others' 4 s limit ended it, naming them: the exception was never printed)."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_raise_in_finally.py")
    p = run_job(n, [sys.executable, script, mode, *case.split()], timeout=120)
    if case == "all":
        assert p.returncode == 0 and p.stdout.count("stopped early") == n - (
            mode == "hybrid"), (p.returncode, p.stdout, p.stderr)
    elif case == "exit":
        assert p.returncode == 3 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    else:
        assert p.returncode not in (0, 124, 137), (case, p.returncode, p.stderr)
        assert "ValueError: the last worker's bug" in p.stderr, p.stderr
        assert "out of step" not in p.stderr and "not reached" not in p.stdout, p.stderr
        assert "inside opt.step()" not in p.stderr, p.stderr


@pytest.mark.parametrize("case,mode,n,want", [
    ("steps", "hybrid", 3, "the workers are out of step: worker 0 asked for a step while "
                           "worker 1 asked for the end (shutdown)"),
    ("steps", "colocated", 2, "the workers are out of step: worker 0 asked for a step while "
                              "worker 1 asked for the end (shutdown)"),
    ("batch", "hybrid", 3, "batches: batch_size=4 on worker 1, batch_size=2 on worker 0: "
                           "every worker"),
    ("phase", "allreduce", 2, "the workers are out of step: worker 0 in pt.checkpoint at "
                              "step 2, worker 1 in pt.batches() at step 2"),
    ("last", "hybrid", 3, "the workers are out of step: worker 0 in pt.checkpoint at step 3, "
                          "worker 1 in pt.shutdown() at step 3"),
    ("last", "allreduce", 2, "the workers are out of step: worker 0 in pt.checkpoint at "
                             "step 3, worker 1 in pt.shutdown() at step 3"),
    ("steps", "allreduce", 2, "(rank 0/2, worker 0): the workers are out of step: worker 0 "
                              "in opt.step() at step 3, worker 1 in pt.shutdown() at step 2"),
    ("zero", "allreduce", 2, "(rank 0/2, worker 0): the workers are out of step: worker 0 in "
                             "opt.zero_grad() at step 4, worker 1 in pt.shutdown() at step 3"),
    ("checkpoint", "allreduce", 2, "(rank 1/2, worker 1): the workers are out of step: worker 1"
                                   " in opt.step() at step 3, worker 0 in pt.checkpoint at "
                                   "step 2"),
    ("checkpoint", "hybrid", 3, "(rank 1/3, worker 1): the workers are out of step: worker 1 in "
                                "opt.step() at step 3, worker 0 in pt.checkpoint at step 2")])
def test_torch_workers_that_call_differently_end_in_one_line(tmp_path, case, mode, n, want):
    """A worker one step short (a DataLoader of its own) ended the job with the server's
    AssertionError traceback (hybrid) or waited for good (allreduce); a batch_size that
    differs between workers read overlapping rows; pt.checkpoint on worker 0 alone waited
    for good, or (allreduce) matched the others' step collectives and died on garbage; after
    the loop (the others in pt.shutdown()) it waited for the timeout; opt.zero_grad() between
    a backward and its step on worker 0 alone waited for good. Where a worker waits inside a
    step for one in another call, it then waited for pt.init's timeout (600 s by default).
    Oracle: the line, status 2, in time: pt.init's timeout is 3 s, and 60 s where a worker
    waits in a step (a job that waits for it is killed at 45 s)."""
    pytest.importorskip("torch")
    from pshybrid.synthetic import write_synthetic

    data = tmp_path / "d.h5"
    write_synthetic(str(data), 64, seed=1, n_dense=2, cardinalities=(5, 7))
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_out_of_step.py")
    limit = "60" if "out of step: worker" in want and " in opt." in want else "3"
    p = run_job(n, [sys.executable, script, case, mode, str(data), limit], timeout=45)
    assert p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr


def test_a_sole_stopped_torch_worker_is_ended_by_the_server(tmp_path):
    """pshybrid.torch, one server and one worker, which stops (SIGSTOP) between steps: no
    other worker waits for it, and the job hung for good. Oracle: the server's line names
    worker 0 and pt.init's timeout (3 s), status 2, in time."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_out_of_step.py")
    p = run_job(2, [sys.executable, script, "stop", "hybrid", str(tmp_path / "none"), "3"],
                timeout=60)
    assert p.returncode == 2 and re.search(
        r"pshybrid: error \(rank \d, server 0\): worker 0 \(rank \d\) sent no sign of life "
        r"for \d+ s: .*pt\.init\(timeout=\.\.\.\) sets this limit", p.stderr), (p.returncode,
                                                                           p.stderr)


@pytest.mark.parametrize("case,timeout,inside,ends", [
    ("slow", "60", "opt.step() at step 3", "; the job ends at 60 s"),
    ("eval", "2", "pt.shutdown() at step 3", "")])
def test_a_slow_torch_worker_is_named_in_a_warning_and_the_job_goes_on(tmp_path, case,
                                                                       timeout, inside, ends):
    """The time limit's warning, at stall.WARN_S (0.5 s here), names the call the waiting
    worker is inside; a worker slower than that, within the timeout, ends the job as usual;
    pt.shutdown() waits for worker 0 scoring alone (docs/torch.md's example) past the
    timeout (2 s here), warned, never ended (it ended a finished job with status 2).
    Oracle: the warning on worker 1, both workers' "done", status 0."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_out_of_step.py")
    p = run_job(3, [sys.executable, script, case, "hybrid", str(tmp_path / "none"), timeout],
                timeout=120)
    assert p.returncode == 0 and p.stdout.count("done") == 2, (p.returncode, p.stderr)
    line = next((ln for ln in p.stderr.splitlines()
                 if ln.startswith("pshybrid: warning (rank 1/3, worker 1): ")), "")
    assert f" s inside {inside}, waiting for the other workers" in line, p.stderr
    assert line.endswith(f"pt.checkpoint and pt.shutdown alike){ends}"), line


def test_a_worker_in_zero_grad_while_the_others_checkpoint_is_not_out_of_step(tmp_path):
    """``opt.step(); opt.zero_grad(); pt.checkpoint(...)`` on every worker, one worker's
    ``zero_grad`` slow: the others' checkpoint at the steps before its "step 4" ended the
    job as out of step. Its ``zero_grad`` waits for nothing (no backward since the step),
    so it is not judged. Oracle: status 0, both workers' "done", no error line."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_out_of_step.py")
    p = run_job(3, [sys.executable, script, "late", "hybrid", str(tmp_path / "d"), "60"],
                timeout=60)
    assert p.returncode == 0 and p.stdout.count("done") == 2, (p.returncode, p.stderr)
    assert "pshybrid: error" not in p.stderr, p.stderr


@pytest.mark.parametrize("case,want", [
    ("rows", "pt.init: tables=[Table(name='t', rows=278, "),
    ("mode", "pt.init: mode='allreduce' on rank 2, mode='hybrid' on rank 0"),
    ("bucket", "DistributedOptimizer: bucket_mb=0.5 on worker 1, bucket_mb=1.0 on worker 0")])
def test_pt_init_arguments_that_differ_between_ranks_end_in_one_line(case, want):
    """A table 2 rows smaller on the server ran to the end, its workers reading and updating
    rows past the server's shard; a mode that differed hung. Oracle: the line naming the
    argument and the rank, status 2, in time."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_init_differs.py")
    p = run_job(3, [sys.executable, script, case], timeout=120)
    assert p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "not reached" not in p.stdout, p.stderr


@pytest.mark.parametrize("case", ["options", "refused", "parser", "rows", "fields"])
def test_ranks_given_other_options_or_data_end_in_one_line(tmp_path, case):
    """An MPMD launch whose ranks differ in their options hung (other step counts), or,
    where the others' were refused (also by the parser: an invalid choice), waited for
    them for good; a --data path whose file
    differs between nodes (here: each rank's working directory) hung with other row
    counts, or ended in 'loss is nan' with other fields. Oracle: the line naming the
    option or the file on every rank, status 2, in time."""
    from pshybrid.synthetic import write_synthetic

    for d, rows, cards in (("a", 600, (5, 7)), ("b", 400 if case == "rows" else 600,
                                                (5, 7, 9) if case == "fields" else (5, 7))):
        os.mkdir(tmp_path / d)
        write_synthetic(str(tmp_path / d / "x.h5"), rows, seed=1, n_dense=2, cardinalities=cards)
    train = ["train", "--data", "x.h5", "--epochs", "1", *SMALL]
    other = {"options": ["--batch-size", "8"], "refused": ["--steps", "3"],
             "parser": ["--mode", "bogus"]}.get(case, [])
    p = run_job(1, ["-wdir", str(tmp_path / "a"), *pshybrid(*train),
                    ":", "-n", "2", "-wdir", str(tmp_path / "b"), *pshybrid(*train, *other)],
                timeout=120)
    want = {"options": "train: batch_size=8 on rank 1, batch_size=16 on rank 0: every rank "
                       "is given the same options",
            "refused": "(rank 0/3): rank 1: --steps 3 and --epochs 1: give one",
            "parser": "(rank 0/3): rank 1's command line is refused (its line says why): no "
                      "rank runs",
            "rows": "x.h5: rows=400 on rank 1, rows=600 on rank 0: every rank reads the same "
                    "--data (files that differ between nodes?)",
            "fields": "x.h5: fields=Schema(n_dense=2, cardinalities=(5, 7, 9)"}[case]
    assert p.returncode == 2 and want in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("env,alone", [({"PMI_SIZE": "1"}, True), ({"PMI_SIZE": "3"}, False),
                                       ({"PMI_SIZE": "2", "SLURM_STEP_NUM_TASKS": "1"}, False),
                                       ({"SLURM_STEP_NUM_TASKS": "1"}, True),
                                       ({"PMIX_RANK": "0"}, False)])
def test_a_rank_is_alone_by_its_launchers_first_size_variable(monkeypatch, env, alone):
    """An ``mpiexec`` inside a one-task Slurm step inherits SLURM_STEP_NUM_TASKS=1: read
    alone, its ranks skipped the parse verdict and an MPMD refusal hung again."""
    from pshybrid import launch

    for v in launch._SIZE_VARS:
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launch.launched_alone() is alone


def test_ranks_given_other_commands_end_in_one_line(tmp_path):
    """Two commands that both parse (plot on rank 0, train on rank 1) went their own ways."""
    p = run_job(1, ["-wdir", str(tmp_path), *pshybrid("plot", "m.jsonl", "m.png"), ":", "-n",
                    "1", "-wdir", str(tmp_path), *pshybrid("train", *SMALL)], timeout=120)
    assert p.returncode == 2 and "(rank 1/2): rank 1 runs train, rank 0 plot: every rank " \
        "runs the same command" in p.stderr, p.stderr


def test_a_command_of_one_process_under_several_ranks_is_refused_on_each(tmp_path):
    """prep synthetic under mpiexec -n 2: each rank wrote OUT (rank 1 then failed on the
    file rank 0 wrote, exit 2 after the work twice); now refused on both before any
    work, OUT not written. (export and plot take the same path: ``cli.SERIAL``.)"""
    out = tmp_path / "s.h5"
    p = run_job(2, ["-wdir", str(tmp_path), *pshybrid("prep", "synthetic", str(out),
                                                       "--rows", "100")], timeout=120)
    for r in range(2):
        assert f"(rank {r}/2): pshybrid prep runs as one process, and this job has 2 ranks: " \
            "run it without mpiexec or srun" in p.stderr, p.stderr
    assert p.returncode == 2 and not out.exists() and "Traceback" not in p.stderr


@pytest.mark.parametrize("resume", [None, "no-such-ck"])
def test_a_torch_script_refused_ends_in_one_line_per_worker(tmp_path, resume):
    """pshybrid.torch's hook: a PshybridError left uncaught on a worker is one line, as on
    the command line (it printed the whole traceback), and every rank ends with status 2;
    so is ``pt.init``'s own refusal of its ``resume=`` (a traceback on every rank, status 1,
    once a refused pt.init freed its session)."""
    pytest.importorskip("torch")
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_refusal.py")
    p = run_job(2, [sys.executable, script] + ([str(tmp_path / resume)] if resume else []),
                timeout=120)
    want = (f"{tmp_path / resume}: no such checkpoint directory" if resume else
            "a refusal of this test")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"pshybrid: error (rank 0/2): {want}" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_out_of_memory_is_one_line_per_rank_not_a_traceback():
    """An allocation past what the check before step 1 counts (a MemoryError; the MPI
    library refusing a window, here made to fail as a full /dev/shm or ulimit -v does) ends
    the job with one line naming the window, exit status 2 (it printed a 57-line traceback
    on every rank, status 1)."""
    script = ("from mpi4py import MPI\n"
              "import pshybrid.transport as transport\n"
              "from pshybrid.transport import abort_on_error\n"
              "from types import SimpleNamespace as NS\n"
              "def no_room(*a, **k):\n"
              "    raise MPI.Exception(MPI.ERR_NO_MEM)\n"
              "transport.MPI = NS(Win=NS(Allocate=no_room), Exception=MPI.Exception,\n"
              "                   ERR_NO_MEM=MPI.ERR_NO_MEM)\n"
              "with abort_on_error(MPI.COMM_WORLD):\n"
              "    transport.allocate_window(3 * 2**20, MPI.COMM_WORLD, False)\n")
    p = run_job(2, [sys.executable, "-c", script], timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("pshybrid: error")][0]
    assert line.startswith("pshybrid: error (rank ") and (
        "): out of memory: the MPI library could not allocate this rank's 3.0 MiB window of "
        "the tables' shard (") in line and line.endswith(
        "lower --batch-size, --embedding-dim or --mlp, or spread the table over more "
        "--servers on more nodes"), line


def test_a_library_the_job_cannot_load_is_one_line_per_rank(tmp_path):
    """A wrong MPI4PY_LIBMPI (a typo, a module not loaded) printed about 190 lines a rank:
    the error handler loaded MPI again and failed inside itself. A Python without the
    packages (a job started outside its virtual environment) printed a traceback. Each is
    one line a rank now, exit status 2, naming what to check."""
    p = run_job(2, pshybrid("info"), timeout=120, env={"MPI4PY_LIBMPI": "libmpi.so.99"})
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 2, (p.returncode, p.stderr)
    for ln in lines:
        assert ln.startswith("pshybrid: error: cannot load the MPI library (") and ln.endswith(
            "; MPI4PY_LIBMPI=libmpi.so.99): check MPI4PY_LIBMPI, the modules loaded and the "
            "virtual environment (docs/clusters.md)"), ln
    script = tmp_path / "one.py"  # (one rank's package missing, MPI loaded: the others wait)
    script.write_text("import sys\nfrom mpi4py import MPI\nfrom pshybrid.launch import run\n"
                      "def main(argv):\n    if MPI.COMM_WORLD.rank == 1:\n"
                      "        raise ModuleNotFoundError(\"No module named 'h5py'\", "
                      "name='h5py')\n    MPI.COMM_WORLD.Barrier()\n"
                      "sys.exit(run(main, []))\n")
    p = run_job(2, [sys.executable, str(script)], timeout=60)  # (it hung: no abort)
    assert p.returncode != 0 and "No module named 'h5py'" in p.stderr, (p.returncode, p.stderr)
    fake = tmp_path / "numpy"  # (a Python whose numpy is missing)
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", "
                                      "name='numpy')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    q = subprocess.run(pshybrid("info"), env=env, capture_output=True, text=True, timeout=120)
    assert q.returncode == 2 and q.stderr == (
        f"pshybrid: error: No module named 'numpy' in {sys.executable}: activate the virtual "
        "environment pshybrid was installed in (a job script: PSHYBRID_VENV; "
        "docs/clusters.md)\n"), q.stderr


FAKE_CUPY = '''__version__ = "0-fake"
class _Runtime:
    @staticmethod
    def getDeviceCount():
        return {n}
class cuda:
    runtime = _Runtime
'''


def test_info_device_cuda_on_some_workers_only_ends_every_rank(tmp_path):
    """``info --device cuda`` where rank 0 sees a GPU and rank 1 none (a node without one):
    rank 1 ended alone and rank 0 waited in the gather for good; the server printed
    nothing. Now every rank prints one line, exit 2. (Stand-in CuPys: 1 device, 0.)"""
    for name, n in (("one", 1), ("none", 0)):
        (tmp_path / name / "cupy").mkdir(parents=True)
        (tmp_path / name / "cupy" / "__init__.py").write_text(FAKE_CUPY.format(n=n))
    path = os.environ.get("PYTHONPATH", "")
    script = (f'if [ "$PMI_RANK" = 0 ]; then f=one; else f=none; fi; '
              f'PYTHONPATH="{tmp_path}/$f:{path}" exec {sys.executable} -m pshybrid info '
              "--device cuda")
    p = run_job(3, ["bash", "-c", script], timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pshybrid: error")]
    assert p.returncode == 2 and len(lines) == 3, (p.returncode, p.stderr)
    why = "--device cuda: no usable CUDA device: no CUDA device visible (device count 0)"
    assert sorted(lines) == [f"pshybrid: error (rank {r}/3): {'' if r == 1 else 'rank 1: '}{why}"
                             for r in range(3)], lines


@pytest.mark.parametrize("timeout", ["3", "none"])
def test_a_step_past_step_timeout_ends_the_job_naming_each_workers_phase(timeout):
    """Worker 1 spends 30 s (with --step-timeout none: 2 s) in its fwd_bwd at step 5; a
    stopped or stuck rank hung train for good (no line). Oracle: with --step-timeout 3, one
    line from each worker naming step 5 and its phase (the slow one its own fwd_bwd, the
    other its wait in the Allreduce), a non-zero status, long before the 30 s; without a
    limit, the warnings (at stall.WARN_S, 0.5 s here) and the run's end, status 0."""
    seconds = "30" if timeout == "3" else "2"
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_slow_step.py")
    t0 = time.monotonic()
    p = run_job(3, [sys.executable, script, "0.5", seconds, "train", "--steps", "8",
                    "--progress", "none", "--step-timeout", timeout, *SMALL], timeout=120)
    took = time.monotonic() - t0
    kind = "error" if timeout == "3" else "warning"
    for rank, phase in ((1, "fwd_bwd"), (0, "allreduce")):
        want = (re.escape(f"pshybrid: {kind} (rank {rank}, worker {rank}): ")
                + rf"\d+ s inside a step at step 5 \(its {phase} phase\), waiting for the other")
        assert re.search(want, p.stderr), (want, p.stderr)
    if timeout == "3":
        # (2, or 9 / 11 where the launcher reports two ranks' aborts at once: docs)
        assert p.returncode != 0 and took < 25 and "--step-timeout sets this limit" in p.stderr, (
            p.returncode, took, p.stderr)
    else:
        assert p.returncode == 0 and "done: hybrid wdl  8 steps" in p.stdout, (p.returncode,
                                                                              p.stderr)
    assert "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("seconds", ["60", "2"])
def test_a_sole_worker_stuck_in_the_first_step_ends_the_job(seconds):
    """The run's first step (kernels compile) got the warning alone: a sole worker stuck
    there in a call that lets its timer's thread run (a hung file system; here a sleep)
    beat on, so the servers waited too, and the job hung for good. It now ends at
    max(--step-timeout, stall.FIRST_STEP_S: 4 s here). Oracle: stuck (60 s), the line
    names the first step and its limit, a non-zero status, before the test's 40 s; slow
    (2 s, past --step-timeout 1), the warning and the run's end, status 0."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_slow_step.py")
    env = dict(SLOW_WORKER="0", SLOW_STEP="0", FIRST_STEP_S="4")
    p = run_job(2, [sys.executable, script, "0.5", seconds, "train", "--steps", "4",
                    "--progress", "none", "--step-timeout", "1", *SMALL], timeout=40, env=env)
    if seconds == "60":
        assert p.returncode != 0 and re.search(
            r"pshybrid: error \(rank \d, worker 0\): \d+ s inside a step at step 0 \(its "
            r"fwd_bwd phase\).*--step-timeout sets this limit \(at least 4 s for a run's "
            r"first step\)", p.stderr), (p.returncode, p.stderr)
    else:
        assert p.returncode == 0 and "done: hybrid wdl  4 steps" in p.stdout, (p.returncode,
                                                                              p.stderr)
        assert "s inside a step at step 0" in p.stderr, p.stderr  # (the warning)
    assert "Traceback" not in p.stderr, p.stderr


def test_a_worker_stopped_before_a_logs_allreduce_ends_the_job():
    """Worker 1 stops (SIGSTOP) after step 5's collective calls, before the log's Allreduce
    of that --log-every step: worker 0 waited in that Allreduce outside its step timer, and
    the job hung for good without a line. Oracle: worker 0's line names step 5 (0-based
    4), the job ends long before the test's limit, a non-zero status."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_stopped_worker.py")
    t0 = time.monotonic()
    p = run_job(3, [sys.executable, script, "60", "5", "train", "--steps", "8",
                    "--progress", "none", "--step-timeout", "3", *SMALL], timeout=60)
    assert p.returncode != 0 and time.monotonic() - t0 < 40, (p.returncode, p.stderr)
    assert re.search(re.escape("pshybrid: error (rank 0, worker 0): ")
                     + r"\d+ s inside a step at step 4, waiting for the other", p.stderr), (
        p.stderr)


@pytest.mark.parametrize("mode,where", [
    ("hybrid", "step"), ("ps", "step"), ("hybrid", "checkpoint"), ("allreduce", "checkpoint"),
    ("colocated", "checkpoint")])
def test_a_stopped_worker_no_step_timer_sees_ends_the_job(tmp_path, mode, where):
    """The last worker stops (SIGSTOP) at step 5, or inside checkpoint 4 (its files written,
    the others waiting in the collective call after them). The sole worker of one server
    (hybrid, ps) was timed by nobody (the server only waited for its messages, plain SGD
    sends them none, and not at all in a checkpoint's collective calls), and the other
    worker of two (allreduce, colocated) only warned (a checkpoint may last by design): the
    job hung for good. Oracle: the line of the server or the next worker names the stopped
    worker and --step-timeout, and the job ends long before the test's limit with a
    non-zero status."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_stopped_worker.py")
    at = (["4:checkpoint", "train", "--checkpoint-dir", str(tmp_path / "ck"),
           "--checkpoint-every", "4"] if where == "checkpoint" else ["5", "train"])
    how = (["--placement", "colocated"] if mode == "colocated" else ["--mode", mode])
    t0 = time.monotonic()
    p = run_job(2, [sys.executable, script, "60", *at, "--steps", "8", *how,
                    "--progress", "none", "--step-timeout", "3", *SMALL], timeout=60)
    assert p.returncode != 0 and time.monotonic() - t0 < 40, (p.returncode, p.stderr)
    last = "0" if mode in ("hybrid", "ps") else "1"
    assert re.search(r"pshybrid: error \(rank \d, (server|worker) 0\): worker " + last
                     + r" \(rank \d\) sent no sign of life for \d+ s: its process is stopped or "
                     r"stuck .*--step-timeout sets this limit", p.stderr), p.stderr


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_a_job_suspended_longer_than_step_timeout_goes_on_when_continued(tmp_path, placement):
    """Every rank stopped (SIGSTOP) for 6 s inside step 5 and then continued, as a batch
    system suspends and resumes a job (``scontrol suspend``, gang scheduling): the step
    timers counted the stop, and --step-timeout 3 ended the job at once when it was
    continued (status 2, no checkpoint). Oracle: the run ends normally, its 8 steps done,
    no error or warning line (stall.WARN_S is 60 s)."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_suspended.py")
    t0 = time.monotonic()
    p = run_job(3, [sys.executable, script, str(tmp_path), "5", "6", "train", "--steps", "8",
                    "--placement", placement, "--progress", "none", "--step-timeout", "3",
                    *SMALL], timeout=120)
    assert p.returncode == 0 and "done: hybrid wdl  8 steps" in p.stdout, (p.returncode,
                                                                          p.stderr)
    assert time.monotonic() - t0 > 6 and "pshybrid:" not in p.stderr, p.stderr


@pytest.mark.parametrize("merged", [False, True])
def test_a_run_whose_output_pipe_closes_ends_like_sigpipe(merged):
    """``train ... | head -1``, one process (under mpiexec the launcher holds the pipe): the
    write after head ended was a BrokenPipeError traceback, twice; with ``2>&1 |`` the
    stop's own line hit the closed pipe too, and the status was 1. Oracle: the first line
    read, status 128 + SIGPIPE, and with stderr apart one line there, no traceback."""
    p = subprocess.Popen(pshybrid("train", "--mode", "allreduce", "--steps", "100000",
                                  "--progress", "lines", "--log-every", "1", *SMALL),
                         stdout=subprocess.PIPE, text=True,
                         stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    bound = threading.Timer(120, p.kill)  # (the reads below wait for the process: a bound)
    bound.start()
    try:
        first = p.stdout.readline()
        p.stdout.close()  # (head exits)
        err = "" if merged else p.stderr.read()
        code = p.wait(timeout=120)
    finally:
        bound.cancel()
        p.kill()
    assert first.startswith("plan: allreduce wdl") and code == 128 + signal.SIGPIPE, (first,
                                                                                       code)
    assert merged or err == ("pshybrid: stopped: an output pipe was closed (its reader "
                             "ended, as | head does once it has its lines)\n"), err


@pytest.mark.parametrize("call", ["checkpoint", "evaluation"])
def test_worker_0_ending_a_checkpoint_or_evaluation_alone_only_warns(tmp_path, call):
    """Worker 0 spends 6 s after a checkpoint's or an evaluation's last collective call (its
    --keep-last pruning, the AUC): the other worker waited for it inside its next step, and
    --step-timeout 3 ended the job, where the docs promise a checkpoint and an evaluation
    the warning, never the end. Oracle: the run ends normally, each worker warned inside
    the call, no error line."""
    script = os.path.join(os.path.dirname(__file__), "jobs", "train_slow_tail.py")
    data = str(tmp_path / "d.h5")
    assert subprocess.run([sys.executable, "-m", "pshybrid", "prep", "synthetic", data,
                           "--rows", "2000", "--valid-fraction", "0.5",
                           "--max-cardinality", "100"], capture_output=True).returncode == 0
    what = (["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "4"]
            if call == "checkpoint" else
            ["--data", data, "--eval-data", data.replace(".h5", ".valid.h5"),
             "--eval-every", "4"])
    p = run_job(3, [sys.executable, script, "0.5", "6", call, "train", "--steps", "6",
                    "--progress", "none", "--step-timeout", "3", *what, *SMALL], timeout=120)
    name = "a checkpoint" if call == "checkpoint" else "an evaluation"
    assert p.returncode == 0 and "done: hybrid wdl  6 steps" in p.stdout, (p.returncode,
                                                                          p.stderr)
    for rank in (0, 1):
        assert re.search(re.escape(f"pshybrid: warning (rank {rank}, worker {rank}): ")
                         + rf"\d+ s inside {name} at step 4,", p.stderr), p.stderr
    assert "pshybrid: error" not in p.stderr and "Traceback" not in p.stderr, p.stderr
