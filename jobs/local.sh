#!/usr/bin/env bash
# bash jobs/local.sh [N]   — run pshybrid on this machine with N ranks (default 4).
set -euo pipefail
N="${1:-4}"
exec mpiexec -n "$N" python -m pshybrid info
