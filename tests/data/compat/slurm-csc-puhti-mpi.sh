#!/bin/bash
#SBATCH --job-name=example
#SBATCH --account=project_2001234
#SBATCH --time=00:15:00
#SBATCH --partition=test
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=40
#SBATCH --mem-per-cpu=1000

srun myprog <options>
