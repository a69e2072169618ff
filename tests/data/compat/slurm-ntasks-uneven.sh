#!/bin/bash
# Five ranks on two nodes: Slurm places 3+2; berth holds 3 CPUs a node and keeps the 5 tasks.
#SBATCH -N 2
#SBATCH -n 5
#SBATCH -t 5
srun ./a.out
