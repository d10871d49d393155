#!/usr/bin/env bash
# bash jobs/local.sh [N] [train options...]   — train on this machine with N ranks (default 4)
# One server per node by default (here: 1 server, N-1 workers); any `train` option passes through,
# e.g.  bash jobs/local.sh 4 --mode ps --steps 500 --config jobs/local.toml --checkpoint-dir ck
# With --checkpoint-dir DIR (or CKPT=DIR in the environment) a rerun resumes from DIR/latest
# (unless the command line resumes from DIR or a step of it itself: pshybrid_resume, jobs/lib.sh),
# and SIGUSR1 or SIGTERM (kill -USR1 <this script's pid>) makes every rank stop at the next step
# boundary after writing that step's checkpoint: exit status 75 (Ctrl-C: 130); run the same
# command again to continue.
# MPIEXEC: the launcher and its own options, as words (default: the mpiexec first on PATH, the
# mpich wheel's in its venv), e.g. for a system Open MPI (docs/clusters.md):
#   MPI4PY_LIBMPI=libmpi.so.40 MPIEXEC="mpiexec.openmpi -x MPI4PY_LIBMPI" bash jobs/local.sh 4
set -euo pipefail
. "$(dirname "$0")/lib.sh"
case "${1:-}" in
  "" | -*) N=4 ;;  # (no N: the first word is a train option)
  *) N="$1" && shift ;;
esac
args=("$@")
if ! ckpt="$(pshybrid_option checkpoint-dir "$@")" && [ -n "${CKPT:-}" ]; then
  ckpt="$CKPT"
  args+=("--checkpoint-dir=$CKPT")
fi
if [ -n "$ckpt" ]; then
  mapfile -t resume < <(pshybrid_resume "$ckpt" "$@")
  args+=(${resume[@]+"${resume[@]}"})
fi
read -ra launcher <<< "${MPIEXEC:-mpiexec}"
# exec: a signal sent to this script's pid reaches mpiexec, which passes it to every rank
# (${a[@]+"${a[@]}"}: an empty array under set -u, which bash before 4.4 calls unbound)
exec "${launcher[@]}" -n "$N" python -m pshybrid train ${args[@]+"${args[@]}"}
