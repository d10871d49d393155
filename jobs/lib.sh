#!/usr/bin/env bash
# . jobs/lib.sh   — shared by the jobs/ scripts (sourced, not run): environment, resume, signals.
# pshybrid_env            activate the software: `module load $PSHYBRID_MODULES` (if set, e.g.
#                         "openmpi/4.1.6 cuda/12.4"), then the virtual environment
#                         $PSHYBRID_VENV (default: .venv in the submit directory) if it exists.
# pshybrid_option NAME ARGS...
#                         prints the value the last --NAME of ARGS gives (--NAME V or --NAME=V)
#                         and succeeds, else fails: a train command line's --checkpoint-dir.
# pshybrid_resume DIR ARGS...
#                         prints "--resume=DIR" when DIR/latest exists (a requeued or rerun job
#                         continues from its newest complete checkpoint), unless ARGS resume
#                         from DIR or a step of it themselves, or give --resume none; else
#                         nothing. Put it after ARGS: it outranks their --resume of another
#                         directory, which started the first run (the rerun's was refused:
#                         DIR holds newer checkpoints); with --init-from in ARGS (the first
#                         run started from a checkpoint elsewhere) also "--init-from=none":
#                         the run goes on from its own; nothing where that --init-from is
#                         DIR or a step of it (a later day's run given the day before's
#                         directory: train refuses it, instead of resuming the day before).
# pshybrid_run CMD...     runs CMD in the background, forwards SIGUSR1, SIGTERM and SIGINT to
#                         it (srun and mpiexec pass them to every rank: the workers checkpoint
#                         at the next step boundary and exit 75, 130 for SIGINT), waits, and
#                         returns CMD's status; the signal this script caught is left in
#                         PSHYBRID_SIGNAL. srun takes one SIGINT as a request for its tasks'
#                         status (two in a second kill them), so inside a Slurm job a SIGINT
#                         goes to the job's steps by scancel --signal=INT instead.
# pshybrid_requeue STATUS exit status 75 (stopped after its checkpoint) after a SIGUSR1 (the
#                         time limit's --signal=B:USR1, or scancel --signal=USR1): requeue this
#                         Slurm job (scontrol requeue) and succeed. After a SIGTERM (scancel,
#                         or Slurm preempting or requeueing the job, which then requeues it
#                         itself) nothing is requeued here (a SIGTERM this script did not
#                         catch, sent to the ranks alone, is told from a SIGUSR1 by nothing:
#                         requeued). Any status but 0 is kept, so an afterok dependency
#                         waits for the run that finishes.
PSHYBRID_PREEMPTED=75
PSHYBRID_SIGNAL=

pshybrid_env() {
  if [ -n "${PSHYBRID_MODULES:-}" ]; then
    # shellcheck disable=SC2086
    module load $PSHYBRID_MODULES
  fi
  local venv="${PSHYBRID_VENV:-${SLURM_SUBMIT_DIR:-$PWD}/.venv}"
  if [ -f "$venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
  elif [ -n "${PSHYBRID_VENV:-}" ]; then  # (asked for by name: a typo would go unseen)
    echo "pshybrid: warning: PSHYBRID_VENV=$PSHYBRID_VENV has no bin/activate: not" \
      "activated; the python on PATH runs" >&2
  fi
}

pshybrid_option() {
  local name="--$1" value= next= found=1 arg
  shift
  for arg in "$@"; do
    if [ -n "$next" ]; then
      value="$arg" next= found=0
      continue
    fi
    case "$arg" in
      "$name") next=1 ;;
      "$name"=*) value="${arg#*=}" found=0 ;;
    esac
  done
  printf '%s' "$value"
  return "$found"
}

pshybrid_within() {  # PATH is DIR or inside it (a step of it, there or not)
  local here
  here="$(cd -- "$2" 2>/dev/null && pwd -P)" ||  # (a step not there: its parent's)
    here="$(cd -- "$(dirname -- "$2")" 2>/dev/null && pwd -P)/$(basename -- "$2")" ||
    here=
  case "$here/" in
    "$(cd -- "$1" && pwd -P)"/*) return 0 ;;
  esac
  return 1
}

pshybrid_resume() {
  local dir="$1" own start given=
  shift
  [ -f "$dir/latest" ] || return 0
  if own="$(pshybrid_option resume "$@")"; then
    [ "$own" != none ] || return 0  # (no resume, as asked: train refuses DIR's checkpoints)
    ! pshybrid_within "$dir" "$own" || return 0  # (DIR or a step of it: the user's choice)
  fi
  if start="$(pshybrid_option init-from "$@")"; then
    given=1  # (a new run from DIR's own checkpoint: a later day's given the day before's
    # directory; not this run's to resume: train refuses the directory, naming it)
    [ "$start" = none ] || ! pshybrid_within "$dir" "$start" || return 0
  fi
  printf '%s\n' "--resume=$dir"  # (one word: a DIR that starts with "-" stays a value)
  if [ -n "$given" ]; then
    printf '%s\n' "--init-from=none"  # (train refuses both: the run's own start was that)
  fi
}

pshybrid_run() {
  local pid status
  "$@" &
  pid=$!
  trap 'PSHYBRID_SIGNAL=USR1; kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'PSHYBRID_SIGNAL=TERM; kill -TERM "$pid" 2>/dev/null || true' TERM
  trap 'PSHYBRID_SIGNAL=INT; pshybrid_interrupt "$pid"' INT
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
  if [ "$1" -ne "$PSHYBRID_PREEMPTED" ] || [ -z "${SLURM_JOB_ID:-}" ]; then
    return "$1"
  fi
  if [ "$PSHYBRID_SIGNAL" = TERM ]; then
    echo "pshybrid: job $SLURM_JOB_ID stopped by SIGTERM after its checkpoint (scancel, or Slurm" \
      "preempting or requeueing it): not requeued by this script; a job Slurm requeues" \
      "restarts by itself, a cancelled one continues when submitted again"
    return "$1"
  fi
  echo "pshybrid: job $SLURM_JOB_ID stopped after its checkpoint: requeueing it"
  if scontrol requeue "$SLURM_JOB_ID"; then
    return 0
  fi
  echo "pshybrid: scontrol requeue refused (a job submitted with --no-requeue, or one Slurm" \
    "requeued already: squeue -j $SLURM_JOB_ID); if it is not pending, submit it again to" \
    "continue from its checkpoint"
  return "$1"
}
