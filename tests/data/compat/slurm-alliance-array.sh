#!/bin/bash
# A job array over ten inputs.
#SBATCH --account=def-someuser
#SBATCH --time=0-0:10
#SBATCH --array=1-10
#SBATCH --mem-per-cpu=100M
#SBATCH --output=slurm-%A_%a.out
./myapplication $SLURM_ARRAY_TASK_ID
