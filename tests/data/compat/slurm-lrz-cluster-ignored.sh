#!/bin/bash
# The LRZ-style script above, submitted with --ignore-unsupported.
#SBATCH -J job_name
#SBATCH -o ./%x.%j.%N.out
#SBATCH -D ./
#SBATCH --get-user-env
#SBATCH --clusters=cm2_tiny
#SBATCH --partition=cm2_tiny
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=28
#SBATCH --mail-type=end
#SBATCH --mail-user=someone@example.org
#SBATCH --export=NONE
#SBATCH --time=08:00:00
module load slurm_setup
mpiexec -n $SLURM_NTASKS ./myprog.exe
