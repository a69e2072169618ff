#!/bin/bash
# A hundred tasks, at most ten running at once.
#SBATCH --account=def-someuser
#SBATCH --array=0-99%10
#SBATCH --time=1:00:00
#SBATCH --ntasks=1
echo "task $SLURM_ARRAY_TASK_ID"
