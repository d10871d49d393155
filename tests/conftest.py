"""Test harness: MPI tests must never hang.

- MPI tests (``@pytest.mark.mpi``) run under ``mpiexec -n N python -m pytest --with-mpi``
  (tests/run.py does this at 2, 3 and 5 ranks). Their bodies reduce pass/fail across
  ranks before asserting (``mpi_util.assert_all``).
- If a test still fails on one rank only, the hook below prints the failure and calls
  ``MPI_Abort``, which ends every rank at once instead of letting the others hang in
  the next test's collective.
- pytest-timeout (thread method, setup.cfg) ends a stuck rank; tests/run.py puts an
  outer ``timeout`` on every mpiexec.
- The tests run as from a terminal: a SIGINT that a background launch left ignored (``cmd &``
  in a script) is heard again, since pshybrid leaves an ignored signal ignored and the
  signal tests press Ctrl-C at their children.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and item.config.getoption("with_mpi", False) and _world().size > 1:
        w = _world()
        sys.stderr.write(f"\n[rank {w.rank}/{w.size}] FAILED {item.nodeid} ({rep.when}):\n"
                         f"{rep.longreprtext}\n[rank {w.rank}] aborting the MPI job\n")
        sys.stderr.flush()
        if not os.environ.get("PSHYBRID_TEST_NO_ABORT"):
            w.Abort(1)  # Wire: kills every rank; nobody waits.


@pytest.fixture
def comm():
    """A fresh Dup of COMM_WORLD per test (the library never uses COMM_WORLD itself)."""
    c = _world().Dup()
    yield c
    c.Free()


@pytest.fixture
def modes_restored():
    """The mode and strategy registries as they were before the test: importing
    ``bench/modes_bench`` registers its "compute" mode and "local" strategies, which no later
    test may see among the product's (``test_architecture``: the docs list exactly the
    registered modes; ``test_catalogue``: every strategy is a mode's)."""
    from pshybrid.modes.dense import DENSE
    from pshybrid.modes.sparse import SPARSE
    from pshybrid.registry import MODES

    kept = [(r, dict(r)) for r in (MODES, SPARSE, DENSE)]
    imported = "modes_bench" in sys.modules
    yield
    for registry, entries in kept:
        registry.clear()
        registry.update(entries)
    if not imported:  # (its registrations are gone: a later import must run it again, or a
        sys.modules.pop("modes_bench", None)  # later test meets it without "compute")
