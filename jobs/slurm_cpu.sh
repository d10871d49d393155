#!/usr/bin/env bash
# sbatch jobs/slurm_cpu.sh   — hybrid WDL training on a CPU cluster: 4 nodes x 8 ranks.
#SBATCH --job-name=pshybrid-cpu
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=4
#SBATCH --time=02:00:00
#SBATCH --output=pshybrid-%j.out
# Servers: one per node by default (pshybrid places them on the last rank of each node), so
# every node contributes parameter-server bandwidth; 4 servers + 28 workers here.
# Threads: each rank gets the cores Slurm bound it to (--cpus-per-task); set OMP_NUM_THREADS
# yourself to override.
set -euo pipefail
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS" MKL_NUM_THREADS="$OMP_NUM_THREADS"
srun --cpu-bind=cores python -m pshybrid train \
  --mode hybrid --model wdl --servers "$SLURM_JOB_NUM_NODES" \
  --batch-size 256 --steps 20000 --metrics "pshybrid-$SLURM_JOB_ID.jsonl" "$@"
