#!/bin/bash
# The second job of a chain: starts when job 4242 has ended successfully.
#SBATCH --dependency=afterok:4242
#SBATCH -N 1
#SBATCH --ntasks-per-node=32
#SBATCH -t 30:00

srun ./post.exe
