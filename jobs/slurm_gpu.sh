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
# CUDA-aware system MPI, docs/clusters.md; CONFIG default jobs/slurm_gpu.toml; CKPT; SRUN_MPI);
# DEVICE=cpu trains on the CPUs of the same layout. Preemption and the time limit: SIGUSR1 ->
# checkpoint at the next step boundary -> exit 75 -> requeue -> resume from $CKPT/latest.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
. jobs/lib.sh
pshybrid_env
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
CKPT="${CKPT:-checkpoints/${SLURM_JOB_NAME:-pshybrid-gpu}}"
mapfile -t resume < <(pshybrid_resume "$CKPT")
status=0
pshybrid_run srun --mpi="${SRUN_MPI:-pmix}" --cpu-bind=cores python -m pshybrid train \
  --config "${CONFIG:-jobs/slurm_gpu.toml}" --servers "${SLURM_JOB_NUM_NODES:-1}" \
  --device "${DEVICE:-cuda}" --checkpoint-dir "$CKPT" \
  --metrics "pshybrid-${SLURM_JOB_ID:-local}.jsonl" ${resume[@]+"${resume[@]}"} "$@" || status=$?
pshybrid_requeue "$status"
