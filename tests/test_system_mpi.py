"""docs/clusters.md's recipe: the system's MPI instead of the ``mpich`` wheel, with the wheel
still installed (``MPI4PY_LIBMPI``). Runs where Open MPI's launcher ``mpiexec.openmpi`` is
installed (Debian/Ubuntu: ``apt-get install openmpi-bin``), else skips. Oracle: training on
Open MPI ends with the loss of the same run on the wheel's MPICH."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from mpi_util import JOB_TIMEOUT, pshybrid, run_job, signal_when

pytestmark = [pytest.mark.job,
              pytest.mark.skipif(shutil.which("mpiexec.openmpi") is None,
                                 reason="no system Open MPI (mpiexec.openmpi)")]
ENV = dict(os.environ, MPI4PY_LIBMPI="libmpi.so.40", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def openmpi(n, args, launcher=()):
    cmd = ["mpiexec.openmpi", "-n", str(n), "-x", "MPI4PY_LIBMPI", *launcher, sys.executable,
           *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, env=ENV,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"hung: {cmd}\n{e.stdout}\n{e.stderr}") from None


TRAIN = ["train", "--steps", "3", "--batch-size", "8", "--mlp", "8,4", "--embedding-dim", "4",
         "--dtype", "float64", "--log-every", "1", "--progress", "none"]


def test_info_and_training_run_on_the_system_open_mpi(tmp_path):
    p = openmpi(3, ["-m", "pshybrid", "info"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MPI library     : Open MPI" in p.stdout and "ranks           : 3" in p.stdout, p.stdout
    summary = {}
    for name in ("openmpi", "mpich"):
        out = str(tmp_path / f"{name}.jsonl")
        argv = ["-m", "pshybrid", *TRAIN, "--metrics", out]
        p = (openmpi(3, argv) if name == "openmpi"
             else run_job(3, pshybrid(*TRAIN, "--metrics", out)))
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        summary[name] = json.loads(open(out).read().splitlines()[-1])
    a, b = summary["openmpi"]["final_loss"], summary["mpich"]["final_loss"]
    assert abs(a - b) <= 1e-12 * abs(b), summary


def test_open_mpi_over_tcp_names_the_thread_level_and_trains_at_it(tmp_path):
    """Open MPI 4 over plain TCP (one-sided through osc pt2pt, as on a cluster without UCX
    or RDMA; here forced on one node) refuses windows under MPI_THREAD_MULTIPLE, mpi4py's
    default: it was 'out of memory ... lower --batch-size'. Oracle: the line names
    MPI4PY_RC_THREAD_LEVEL=serialized, and with it set the run ends on the loss of the same
    run on the wheel's MPICH."""
    tcp = ["--mca", "btl", "self,tcp", "--mca", "osc", "pt2pt"]
    argv = ["-m", "pshybrid", *TRAIN, "--shared-memory", "off"]
    p = openmpi(3, argv, tcp)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert "set MPI4PY_RC_THREAD_LEVEL=serialized in every rank's environment" in p.stderr, \
        p.stderr
    summary = {}
    for name in ("serialized", "mpich"):
        out = str(tmp_path / f"{name}.jsonl")
        p = (openmpi(3, [*argv, "--metrics", out],
                     [*tcp, "-x", "MPI4PY_RC_THREAD_LEVEL=serialized"]) if name == "serialized"
             else run_job(3, pshybrid(*TRAIN, "--shared-memory", "off", "--metrics", out)))
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        summary[name] = json.loads(open(out).read().splitlines()[-1])["final_loss"]
    assert abs(summary["serialized"] - summary["mpich"]) <= 1e-12 * abs(summary["mpich"]), summary


def test_open_mpi_mpirun_is_named_at_the_start_and_sigusr1_checkpoints(tmp_path):
    """Open MPI's mpirun passes a SIGTERM on 1 s late and kills the ranks 1 s after it, too
    soon for a checkpoint: a run with --checkpoint-dir says so at the start; SIGUSR1 to
    mpirun reaches the ranks at once. Oracle: the note, status 75 and the checkpoint."""
    metrics = tmp_path / "m.jsonl"
    cmd = ["mpiexec.openmpi", "-n", "2", "-x", "MPI4PY_LIBMPI", sys.executable, "-m",
           "pshybrid", *TRAIN[:2], "1000000", *TRAIN[3:], "--checkpoint-dir", "ck",
           "--metrics", str(metrics)]
    rc, out, err = signal_when(cmd, lambda: metrics.exists() and '"step"' in
                               metrics.read_text(), signal.SIGUSR1, cwd=tmp_path, env=ENV)
    assert rc == 75, (rc, out, err)
    assert "pshybrid: note: Open MPI's mpirun passes a SIGTERM or SIGINT on to the ranks 1 s " \
        "late" in err, err
    m = re.search(r"stopped by SIGUSR1 at step (\d+): checkpoint ck/step-\1 written", out)
    assert m and (tmp_path / "ck" / f"step-{m.group(1)}").is_dir(), (out, err)
