#!/bin/bash
# Slurm time format: days-hours:minutes:seconds.
#SBATCH -t 3-00:00:00
#SBATCH -n 2
srun ./a.out
