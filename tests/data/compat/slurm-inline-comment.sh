#!/bin/bash
#SBATCH --time=10      # ten minutes
#SBATCH --ntasks=2     # two ranks
#SBATCH --job-name=commented   # a name
srun ./a.out
