#!/usr/bin/env bash
# . jobs/lib.sh   — shared by the jobs/ scripts (sourced, not run): environment, resume, signals.
# pshybrid_env            activate the software: `module load $PSHYBRID_MODULES` (if set, e.g.
#                         "openmpi/4.1.6 cuda/12.4"), then the virtual environment
#                         $PSHYBRID_VENV (default: .venv in the submit directory) if it exists.
# pshybrid_resume DIR     prints "--resume DIR" when DIR/latest exists (a requeued or rerun job
#                         continues from its newest complete checkpoint), else nothing.
# pshybrid_run CMD...     runs CMD in the background, forwards SIGUSR1, SIGTERM and SIGINT to
#                         it (srun and mpiexec pass them to every rank: the workers checkpoint
#                         at the next step boundary and exit 75, 130 for SIGINT), waits, and
#                         returns CMD's status. srun takes one SIGINT as a request for its
#                         tasks' status (two in a second kill them), so inside a Slurm job a
#                         SIGINT goes to the job's steps by scancel --signal=INT instead.
# pshybrid_requeue STATUS exit status 75 (stopped by a signal after its checkpoint): requeue this
#                         Slurm job (scontrol requeue) and succeed; any other status: keep it.
PSHYBRID_PREEMPTED=75

pshybrid_env() {
  if [ -n "${PSHYBRID_MODULES:-}" ]; then
    # shellcheck disable=SC2086
    module load $PSHYBRID_MODULES
  fi
  local venv="${PSHYBRID_VENV:-${SLURM_SUBMIT_DIR:-$PWD}/.venv}"
  if [ -f "$venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
  fi
}

pshybrid_resume() {
  if [ -f "$1/latest" ]; then
    printf '%s\n' --resume "$1"
  fi
}

pshybrid_run() {
  local pid status
  "$@" &
  pid=$!
  trap 'kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'kill -TERM "$pid" 2>/dev/null || true' TERM
  trap 'pshybrid_interrupt "$pid"' INT
  while :; do
    status=0
    wait "$pid" || status=$?
    kill -0 "$pid" 2>/dev/null || break  # ended: $status is its own, not a trap's 128+n
  done
  trap - USR1 TERM INT
  return "$status"
}

pshybrid_interrupt() {
  if [ -n "${SLURM_JOB_ID:-}" ] && command -v scancel >/dev/null 2>&1 &&
      scancel --signal=INT "$SLURM_JOB_ID" 2>/dev/null; then  # the steps, not this script
    return 0
  fi
  kill -INT "$1" 2>/dev/null || true
}

pshybrid_requeue() {
  if [ "$1" -eq "$PSHYBRID_PREEMPTED" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "pshybrid: job $SLURM_JOB_ID stopped after its checkpoint: requeueing it"
    # (a preemption with PreemptMode=REQUEUE is requeued by Slurm itself: then this may refuse)
    scontrol requeue "$SLURM_JOB_ID" || echo "pshybrid: scontrol requeue refused; resubmit to continue"
    return 0
  fi
  return "$1"
}
