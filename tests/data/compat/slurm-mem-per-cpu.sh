#!/bin/bash
# Memory per CPU, in gigabytes.
#SBATCH -n 8
#SBATCH --mem-per-cpu=4G
#SBATCH -t 2:00:00
srun ./a.out
