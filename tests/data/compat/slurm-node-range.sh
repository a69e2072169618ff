#!/bin/bash
# A node range: berth allocates its minimum.
#SBATCH -N 2-4
#SBATCH -n 8
#SBATCH -t 15
srun ./a.out
