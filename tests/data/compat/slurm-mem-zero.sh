#!/bin/bash
# --mem=0 (all of a node's memory) is not supported.
#SBATCH -N 1
#SBATCH --mem=0
#SBATCH -t 10
srun ./a.out
