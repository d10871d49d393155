#!/usr/bin/env bash
# sbatch jobs/slurm_torch.sh SCRIPT.py [args...]   — a pshybrid.torch script, 2 nodes x 4 ranks.
#SBATCH --job-name=pshybrid-torch
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=4
#SBATCH --time=02:00:00
#SBATCH --output=pshybrid-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
# Submit from the repository root (the script sources jobs/lib.sh from there). Environment as
# jobs/slurm_cpu.sh's (PSHYBRID_MODULES, PSHYBRID_VENV, SRUN_MPI); CKPT (default
# checkpoints/<job name>[-<array task id>]) reaches the script as PSHYBRID_CKPT: it resumes
# from there (pt.init(resume=...) when $PSHYBRID_CKPT/latest exists) and writes
# pt.checkpoint there once pt.stop_requested() (docs/torch.md, "Preemption"). 120 s before
# the time limit Slurm sends this script SIGUSR1, which it passes to every rank: the workers
# stop after the same step, the script's checkpoint is written, every rank exits 75, and
# this script requeues the job. A SIGTERM (scancel; Slurm preempting the job) stops it the
# same way but is not requeued here.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
[ -f jobs/lib.sh ] || { echo "pshybrid: submit from the repository root (no jobs/lib.sh in $PWD)" >&2; exit 2; }
. jobs/lib.sh
if [ $# -lt 1 ]; then
  echo "usage: sbatch jobs/slurm_torch.sh SCRIPT.py [script args...]" >&2
  exit 2
fi
pshybrid_env
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
# (a job array's tasks: one directory each, or each would resume the first's run)
CKPT="${CKPT:-checkpoints/${SLURM_JOB_NAME:-pshybrid-torch}${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}}"
export PSHYBRID_CKPT="$CKPT"
SRUN_MPI="${SRUN_MPI-pmi2}"  # (set empty: the cluster's default, MpiDefault)
status=0
# (srun takes no --cpus-per-task from sbatch since Slurm 22.05: without it, one core a rank)
pshybrid_run srun ${SRUN_MPI:+--mpi="$SRUN_MPI"} --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  --cpu-bind=cores python "$@" || status=$?
pshybrid_requeue "$status"
