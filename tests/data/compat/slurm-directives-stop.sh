#!/bin/bash
# Directives end at the first command, as in Slurm: the last #SBATCH is a comment.
#SBATCH -n 2
#SBATCH -t 5

module load gcc
#SBATCH -n 64
srun ./a.out
