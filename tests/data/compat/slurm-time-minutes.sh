#!/bin/bash
# Slurm time format: minutes.
#SBATCH -t 90
#SBATCH -n 2
srun ./a.out
