#!/bin/bash
# Slurm time format: days-hours.
#SBATCH --time=1-12
#SBATCH -n 2
srun ./a.out
