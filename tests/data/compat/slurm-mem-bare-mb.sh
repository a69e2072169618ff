#!/bin/bash
# --mem with no unit is megabytes.
#SBATCH -N 1
#SBATCH --ntasks-per-node=8
#SBATCH --mem=16384
#SBATCH -t 1:00:00
srun ./a.out
