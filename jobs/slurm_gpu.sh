#!/usr/bin/env bash
# sbatch jobs/slurm_gpu.sh   — hybrid training on a GPU cluster: 2 nodes x (4 GPU workers + 1 server).
#SBATCH --job-name=pshybrid-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=5
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --output=pshybrid-%j.out
# One server per node (the last rank of each node, host memory only); the 4 workers of each
# node pin GPU local_rank % 4 (--device cuda, docs/gpu.md; not yet run on a GPU). Needs
# `pip install 'pshybrid[gpu]'`; DEVICE=cpu trains on the CPUs of the same layout.
set -euo pipefail
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
srun --cpu-bind=cores python -m pshybrid train \
  --mode hybrid --model dlrm --servers "$SLURM_JOB_NUM_NODES" --device "${DEVICE:-cuda}" \
  --batch-size 2048 --steps 20000 --metrics "pshybrid-$SLURM_JOB_ID.jsonl" "$@"
