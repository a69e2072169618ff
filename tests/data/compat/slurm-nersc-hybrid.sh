#!/bin/bash
# Hybrid MPI+OpenMP: 8 ranks per node, 16 threads each (NERSC style).
#SBATCH -N 4
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH -t 01:00:00
#SBATCH -J hybrid

export OMP_NUM_THREADS=16
export OMP_PLACES=threads
export OMP_PROC_BIND=spread
srun --cpu-bind=cores ./hybrid.exe
