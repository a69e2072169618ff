#!/bin/bash
# A GPU job (NERSC style): rejected until berth schedules GPUs.
#SBATCH -N 1
#SBATCH -C gpu
#SBATCH -t 00:20:00
#SBATCH --ntasks-per-node=4
#SBATCH -G 4

srun ./gpu.exe
