#!/bin/bash
# Slurm time format: hours:minutes:seconds.
#SBATCH --time=12:00:00
#SBATCH -n 2
srun ./a.out
