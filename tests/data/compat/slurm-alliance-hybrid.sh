#!/bin/bash
# Hybrid MPI+OpenMP over whole nodes, two days.
#SBATCH --account=def-someuser
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=2-00:00:00
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
srun ./hybrid
