#!/bin/bash
# Constraint and QOS lines as NERSC scripts carry them (-C cpu, -q regular).
#SBATCH -N 1
#SBATCH -C cpu
#SBATCH -q regular
#SBATCH -t 10
#SBATCH --ntasks-per-node=64

srun ./a.out
