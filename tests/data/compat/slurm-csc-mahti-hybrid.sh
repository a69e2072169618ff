#!/bin/bash
#SBATCH --job-name=example
#SBATCH --account=project_2001234
#SBATCH --partition=medium
#SBATCH --time=0:10:00
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=32
#SBATCH --cpus-per-task=4

export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
export OMP_PROC_BIND=true
srun myprog <options>
