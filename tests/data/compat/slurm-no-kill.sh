#!/bin/bash
# Keep running if one of the nodes fails.
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --no-kill
#SBATCH -t 10
srun ./resilient
