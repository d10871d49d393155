"""docs/clusters.md's recipe: the system's MPI instead of the ``mpich`` wheel, with the wheel
still installed (``MPI4PY_LIBMPI``). Runs where Open MPI's launcher ``mpiexec.openmpi`` is
installed (Debian/Ubuntu: ``apt-get install openmpi-bin``), else skips. Oracle: training on
Open MPI ends with the loss of the same run on the wheel's MPICH."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from mpi_util import JOB_TIMEOUT, pshybrid, run_job

pytestmark = [pytest.mark.job,
              pytest.mark.skipif(shutil.which("mpiexec.openmpi") is None,
                                 reason="no system Open MPI (mpiexec.openmpi)")]
ENV = dict(os.environ, MPI4PY_LIBMPI="libmpi.so.40", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def openmpi(n, args):
    cmd = ["mpiexec.openmpi", "-n", str(n), "-x", "MPI4PY_LIBMPI", sys.executable, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, env=ENV,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"hung: {cmd}\n{e.stdout}\n{e.stderr}") from None


def test_info_and_training_run_on_the_system_open_mpi(tmp_path):
    p = openmpi(3, ["-m", "pshybrid", "info"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MPI library     : Open MPI" in p.stdout and "ranks           : 3" in p.stdout, p.stdout
    train = ["train", "--steps", "3", "--batch-size", "8", "--mlp", "8,4", "--embedding-dim",
             "4", "--dtype", "float64", "--log-every", "1", "--progress", "none"]
    summary = {}
    for name in ("openmpi", "mpich"):
        out = str(tmp_path / f"{name}.jsonl")
        argv = ["-m", "pshybrid", *train, "--metrics", out]
        p = openmpi(3, argv) if name == "openmpi" else run_job(3, pshybrid(*train, "--metrics",
                                                                          out))
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        summary[name] = json.loads(open(out).read().splitlines()[-1])
    a, b = summary["openmpi"]["final_loss"], summary["mpich"]["final_loss"]
    assert abs(a - b) <= 1e-12 * abs(b), summary
