#!/bin/bash
# Five ranks on two nodes: Slurm places 3+2, berth's uniform shape asks 3 per node.
#SBATCH -N 2
#SBATCH -n 5
#SBATCH -t 5
srun ./a.out
