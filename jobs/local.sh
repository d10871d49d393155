#!/usr/bin/env bash
# bash jobs/local.sh [N] [train options...]   — train on this machine with N ranks (default 4)
# One server per node by default (here: 1 server, N-1 workers); any `train` option passes through,
# e.g.  bash jobs/local.sh 4 --mode ps --steps 500 --metrics run.jsonl
set -euo pipefail
N="${1:-4}"
shift || true
exec mpiexec -n "$N" python -m pshybrid train "$@"
