#!/bin/bash
# A license served by a license server (Slurm's NAME@SERVER): refused, naming the line.
#SBATCH --ntasks=2
#SBATCH --time=10
#SBATCH -L fluent@flexlm:2

srun fluent -g -i run.jou
