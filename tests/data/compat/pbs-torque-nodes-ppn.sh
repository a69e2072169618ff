#!/bin/bash
# Torque-style nodes=N:ppn=P with walltime on one -l line.
#PBS -l nodes=2:ppn=16,walltime=04:00:00
#PBS -N torque_mpi
#PBS -q batch
#PBS -o torque_mpi.out
#PBS -e torque_mpi.err
cd $PBS_O_WORKDIR
mpirun -np 32 ./a.out
