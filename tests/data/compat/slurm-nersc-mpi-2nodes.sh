#!/bin/bash
# Pure MPI on two CPU nodes, one rank per core (NERSC example-job-script style).
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=128
#SBATCH --time=00:30:00
#SBATCH --account=m1234
#SBATCH --job-name=mpi-2nodes

srun --cpu-bind=cores ./mycode.exe
