#!/bin/bash
# Slurm time format: minutes:seconds.
#SBATCH --time=45:30
#SBATCH -n 2
srun ./a.out
