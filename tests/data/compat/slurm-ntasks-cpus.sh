#!/bin/bash
# Ranks and threads without a node count: berth asks for their cores.
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=2
#SBATCH --time=10:00
srun ./a.out
