#!/bin/bash
# A whole node to itself, a few ranks.
#SBATCH --exclusive
#SBATCH -N 1
#SBATCH -n 16
#SBATCH -t 0:20:00

srun -n 16 ./a.out
