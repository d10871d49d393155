#!/usr/bin/env bash
# sbatch jobs/slurm_cpu.sh [train options...]   — hybrid WDL training on a CPU cluster: 4 nodes x 8 ranks.
#SBATCH --job-name=pshybrid-cpu
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=4
#SBATCH --time=02:00:00
#SBATCH --output=pshybrid-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
# Submit from the repository root (the script sources jobs/lib.sh from there). Environment:
# PSHYBRID_MODULES (module load), PSHYBRID_VENV (default ./.venv), CONFIG (default
# jobs/slurm_cpu.toml), CKPT (default checkpoints/<job name>), SRUN_MPI (srun --mpi: pmix, the
# default here, or pmi2; docs/clusters.md). 120 s before the time limit (or on preemption)
# Slurm signals this script, which passes SIGUSR1 to every rank: the workers checkpoint at the
# next step boundary and exit 75, and the script requeues the job, which resumes from
# $CKPT/latest. Servers: one per node (the last rank of each node); threads: the cores Slurm
# bound each rank to (--cpus-per-task).
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
. jobs/lib.sh
pshybrid_env
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
CKPT="${CKPT:-checkpoints/${SLURM_JOB_NAME:-pshybrid-cpu}}"
mapfile -t resume < <(pshybrid_resume "$CKPT")
status=0
pshybrid_run srun --mpi="${SRUN_MPI:-pmix}" --cpu-bind=cores python -m pshybrid train \
  --config "${CONFIG:-jobs/slurm_cpu.toml}" --servers "${SLURM_JOB_NUM_NODES:-1}" \
  --checkpoint-dir "$CKPT" --metrics "pshybrid-${SLURM_JOB_ID:-local}.jsonl" \
  ${resume[@]+"${resume[@]}"} "$@" || status=$?
pshybrid_requeue "$status"
