#!/bin/bash
# MPI by task count, memory per core (Alliance "Running jobs" style).
#SBATCH --account=def-someprof
#SBATCH --ntasks=4
#SBATCH --mem-per-cpu=1024M
#SBATCH --time=0-00:05
srun ./mpi_program
