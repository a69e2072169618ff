#!/bin/bash
# Slurm time format: days-hours:minutes.
#SBATCH --time 2-06:30
#SBATCH -n 2
srun ./a.out
