#!/bin/bash
# One multithreaded process on one node.
#SBATCH --account=def-someuser
#SBATCH --time=0:15:0
#SBATCH --cpus-per-task=32
#SBATCH --mem=4G
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
./ompHello
