#!/usr/bin/env python3
"""The whole test suite, one command: ``python tests/run.py`` (README, .ci/run).

1. serial tests (pure functions, kernels, whole-job tests that launch mpiexec);
2. MPI tests (``-m mpi``) under ``mpiexec -n N python -m pytest --with-mpi`` for
   N = 2, 3, 5 (oversubscribed on small machines; that is fine); the 3-rank run turns the
   same-node shared-memory pull off, so training is also checked over RMA end to end.

Every mpiexec runs under a hard outer timeout, so nothing can hang CI. Only rank 0's
pytest report reaches stdout; other ranks keep stderr. Exits non-zero on any failure
and ends with one summary line ``N passed, N failed, N skipped``.
Extra arguments go to every pytest run (e.g. ``-k store``, ``-x``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from mpi_util import mpiexec  # noqa: E402

SIZES = [int(n) for n in os.environ.get("PSHYBRID_TEST_SIZES", "2,3,5").split(",") if n]
RMA_ONLY_SIZE = 3  # this run turns the same-node shared-memory path off: RMA end to end
MPI_TIMEOUT = int(os.environ.get("PSHYBRID_TEST_MPI_TIMEOUT", "600"))
SERIAL_TIMEOUT = int(os.environ.get("PSHYBRID_TEST_SERIAL_TIMEOUT", "1200"))
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def run(label: str, cmd: list[str], timeout: int, totals: dict) -> bool:
    print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, stdout=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
        out, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out += f"\n!!! {label} ran past {timeout}s: killed (a hang is a failure)\n"
        code = 124
    sys.stdout.write(out)
    summary = [ln for ln in out.splitlines() if COUNT.search(ln) and " in " in ln]
    found = dict((k.rstrip("s") if k.startswith("error") else k, int(n))
                 for n, k in COUNT.findall(summary[-1] if summary else ""))
    for k in ("passed", "failed", "skipped", "error"):
        totals[k] += found.get(k, 0)
    ok = code in (0, 5) and not found.get("failed") and not found.get("error")
    if not ok and not found.get("failed") and not found.get("error"):
        totals["failed"] += 1  # crashed, aborted or timed out without a pytest summary
    print(f"=== {label}: {'ok' if ok else f'FAILED (exit {code})'} in {time.time() - t0:.1f}s",
          flush=True)
    return ok


def main(argv: list[str]) -> int:
    py = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]  # -rs: why skipped
    totals = dict(passed=0, failed=0, skipped=0, error=0)
    ok = run("serial", py + ["-m", "not mpi", "tests"] + argv, SERIAL_TIMEOUT, totals)
    for n in SIZES:
        args = ["-m", "mpi", "--with-mpi", "tests"] + argv
        quiet = ["sh", "-c", 'exec "$@" >/dev/null', "quiet"]  # ranks > 0: stdout dropped
        env = ["-genv", "PSHYBRID_TEST_SHARED_MEMORY", "off"] if n == RMA_ONLY_SIZE else []
        cmd = ["timeout", "-k", "10", str(MPI_TIMEOUT), mpiexec(), *env, "-n", "1"] + py + args
        if n > 1:
            cmd += [":", "-n", str(n - 1)] + quiet + py + args
        label = f"mpi -n {n}" + (" (RMA only)" if env else "")
        ok = run(label, cmd, MPI_TIMEOUT + 30, totals) and ok
    errors = f", {totals['error']} errors" if totals["error"] else ""
    print(f"\n{totals['passed']} passed, {totals['failed']} failed, "
          f"{totals['skipped']} skipped{errors}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
