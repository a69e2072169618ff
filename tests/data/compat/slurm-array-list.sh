#!/bin/bash
# An array of listed indexes.
#SBATCH -a 1,3,5,7
#SBATCH -n 1
#SBATCH -t 5
./run $SLURM_ARRAY_TASK_ID
