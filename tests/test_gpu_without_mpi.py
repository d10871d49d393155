"""A GPU machine whose MPI does not load (no libmpi, no mpich wheel): tests/test_gpu.py still
collects and runs what needs no MPI, and bench/gpu_check.py reports the MPI problem in one
line and goes on. Simulated by pointing mpi4py at a library that does not exist
(MPI4PY_LIBMPI), in subprocesses."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
NO_MPI = dict(os.environ, MPI4PY_LIBMPI="/nonexistent/libmpi.so")


def test_mpi4py_really_fails_to_load_there():
    p = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], env=NO_MPI,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "cannot load MPI library" in p.stderr, p.stderr


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
def test_gpu_tests_run_without_mpi():
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        "-m", "not mpi", "-k", "names or source_checkout or cupy_status or "
                        "device_cuda_without or info_shows", "tests/test_gpu.py"],
                       env=NO_MPI, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    tail = p.stdout.strip().splitlines()[-1]
    assert " passed" in tail and "error" not in tail, p.stdout  # collected: no MPI import
    assert "MPI does not load: RuntimeError: cannot load MPI library" in p.stdout, p.stdout


def test_gpu_check_reports_mpi_in_one_line_and_goes_on():
    probe = ("import sys; sys.path[:0] = ['bench', 'tests']; import gpu_check; "
             "m = gpu_check.mpi_probe(); print(m['line']); print(m['lib'], m['mpiexec'])")
    p = subprocess.run([sys.executable, "-c", probe], env=NO_MPI, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    line, rest = p.stdout.splitlines()
    assert line.startswith("MPI: NOT LOADABLE") and "mpi4py/libmpi does not load" in line, line
    assert rest.split()[0] == "None"  # the training and MPI test steps are then NOT RUN
    ok = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                        timeout=60, cwd=ROOT)
    assert ok.returncode == 0 and ok.stdout.startswith("MPI: ") and "NOT LOADABLE" not in \
        ok.stdout, ok.stdout + ok.stderr
