#!/usr/bin/env bash
# sbatch jobs/slurm_gpu.sh [train options...]   — hybrid training on a GPU cluster: 2 nodes x (4 GPU workers + 1 server).
#SBATCH --job-name=pshybrid-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=5
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --output=pshybrid-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
# One server per node (the last rank of each node, host memory only); the 4 workers of each
# node pin GPU local_rank % 4 (--device cuda, docs/gpu.md). Submit from the repository root.
# Environment as jobs/slurm_cpu.sh (PSHYBRID_MODULES: e.g. "openmpi/4.1.6 cuda/12.4" for a
# CUDA-aware system MPI, docs/clusters.md, with SRUN_MPI=pmix and MPI4PY_LIBMPI; CONFIG default
# jobs/slurm_gpu.toml; CKPT; SRUN_MPI: pmi2 by default, for the mpich wheel and MPICH-family
# MPIs); DEVICE=cpu trains on the CPUs of the same layout. The
# time limit: SIGUSR1 -> checkpoint at the next step boundary -> exit 75 -> requeue -> resume
# from $CKPT/latest; a SIGTERM (scancel, a preemption) checkpoints and is not requeued here.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
[ -f jobs/lib.sh ] || { echo "pshybrid: submit from the repository root (no jobs/lib.sh in $PWD)" >&2; exit 2; }
. jobs/lib.sh
pshybrid_env
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
# (a job array's tasks: one directory each, or each would resume the first's run)
own="$(pshybrid_option checkpoint-dir "$@")" || own=  # (the run's: the command line's, else $CKPT)
CKPT="${own:-${CKPT:-checkpoints/${SLURM_JOB_NAME:-pshybrid-gpu}${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}}}"
SRUN_MPI="${SRUN_MPI-pmi2}"  # (set empty: the cluster's default, MpiDefault)
mapfile -t resume < <(pshybrid_resume "$CKPT" "$@")  # (after "$@": it outranks theirs)
status=0
# (srun takes no --cpus-per-task from sbatch since Slurm 22.05: without it, one core a rank)
pshybrid_run srun ${SRUN_MPI:+--mpi="$SRUN_MPI"} --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  --cpu-bind=cores python -m pshybrid train \
  --config "${CONFIG:-jobs/slurm_gpu.toml}" --servers "${SLURM_JOB_NUM_NODES:-1}" \
  --device "${DEVICE:-cuda}" --checkpoint-dir="$CKPT" \
  --metrics "pshybrid-${SLURM_JOB_ID:-local}.jsonl" "$@" ${resume[@]+"${resume[@]}"} || status=$?
pshybrid_requeue "$status"
