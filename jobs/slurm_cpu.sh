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
# jobs/slurm_cpu.toml), CKPT (default checkpoints/<job name>[-<array task id>]), SRUN_MPI (srun
# --mpi: pmi2, the default here, for the mpich wheel and MPICH-family MPIs; pmix for Open MPI;
# empty: the cluster's default; docs/clusters.md). 120 s before the time limit Slurm sends this
# script SIGUSR1, which it passes to every rank: the workers checkpoint at the next step
# boundary and exit 75, and the script requeues the job, which resumes from $CKPT/latest. A
# SIGTERM (scancel; Slurm preempting the job) checkpoints the same way but is not requeued here
# (a preempted job is requeued by Slurm, if at all). Servers: one per node (the last rank of
# each node); threads: the cores Slurm bound each rank to (--cpus-per-task, given to srun).
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
[ -f jobs/lib.sh ] || { echo "pshybrid: submit from the repository root (no jobs/lib.sh in $PWD)" >&2; exit 2; }
. jobs/lib.sh
pshybrid_env
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
# (a job array's tasks: one directory each, or each would resume the first's run)
own="$(pshybrid_option checkpoint-dir "$@")" || own=  # (the run's: the command line's, else $CKPT)
CKPT="${own:-${CKPT:-checkpoints/${SLURM_JOB_NAME:-pshybrid-cpu}${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}}}"
SRUN_MPI="${SRUN_MPI-pmi2}"  # (set empty: the cluster's default, MpiDefault)
mapfile -t resume < <(pshybrid_resume "$CKPT" "$@")  # (after "$@": it outranks theirs)
status=0
# (srun takes no --cpus-per-task from sbatch since Slurm 22.05: without it, one core a rank)
pshybrid_run srun ${SRUN_MPI:+--mpi="$SRUN_MPI"} --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  --cpu-bind=cores python -m pshybrid train \
  --config "${CONFIG:-jobs/slurm_cpu.toml}" --servers "${SLURM_JOB_NUM_NODES:-1}" \
  --checkpoint-dir="$CKPT" --metrics "pshybrid-${SLURM_JOB_ID:-local}.jsonl" \
  "$@" ${resume[@]+"${resume[@]}"} || status=$?
pshybrid_requeue "$status"
