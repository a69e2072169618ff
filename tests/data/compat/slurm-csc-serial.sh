#!/bin/bash
#SBATCH --job-name=serial
#SBATCH --account=project_2001234
#SBATCH --partition=small
#SBATCH --time=02:00:00
#SBATCH --ntasks=1
#SBATCH --mem-per-cpu=2G

srun myprog
