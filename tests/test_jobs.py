"""Whole-job tests: launch mpiexec in a subprocess, assert on exit code and output."""

import os
import sys
import time

import pytest

from mpi_util import pshybrid, run_job

pytestmark = pytest.mark.job
HERE = os.path.dirname(__file__)


def test_info_prints_both_roles():
    p = run_job(2, pshybrid("info"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert "MPICH" in p.stdout and "CUDA-aware MPI" in p.stdout
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert [ln[1] for ln in lines] == ["worker", "server"], p.stdout


def test_info_allreduce_needs_no_server():
    p = run_job(1, pshybrid("info", "--mode", "allreduce"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert "0 server(s)" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--servers", "2"], "--servers 2 leaves no worker"),
    (["--servers", "-1"], "--servers must be >= 0"),
    (["--servers", "0"], "--servers 0"),
    (["--mode", "bogus"], "invalid choice: 'bogus'"),
])
def test_bad_servers_fail_on_every_rank(args, needle):
    p = run_job(2, pshybrid("info", *args), timeout=60)
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"(rank {rank}/2)" in p.stderr and needle in p.stderr, p.stderr
    assert p.stderr.count("pshybrid: error") == 2, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("kind,needle", [("crash", "RuntimeError: injected failure on rank 2"),
                                         ("user", "injected bad row 42 on rank 2")])
def test_one_rank_raising_ends_the_job_fast(kind, needle):
    t0 = time.time()
    p = run_job(4, [sys.executable, os.path.join(HERE, "jobs", "raise_on_rank.py"), "2", kind],
                timeout=60)
    elapsed = time.time() - t0
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr
    assert "rank 2/4" in p.stderr, p.stderr
    assert elapsed < 10, f"took {elapsed:.1f}s to end the job"
