#!/bin/bash
# Ranks per node and a total: the node count follows.
#SBATCH --ntasks-per-node=4
#SBATCH --ntasks=16
#SBATCH --time=20
srun ./a.out
