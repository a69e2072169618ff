#!/bin/bash
# An array with a step, and %A_%a outputs.
#SBATCH --array=0-30:10
#SBATCH -n 1
#SBATCH -t 5
#SBATCH -o sweep-%A_%a.out
./sweep $SLURM_ARRAY_TASK_ID
