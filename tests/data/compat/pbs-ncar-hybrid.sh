#!/bin/bash
# Hybrid MPI+OpenMP, NCAR style: 4 ranks per node, 32 threads each.
#PBS -N hybrid_job
#PBS -A UABC0001
#PBS -l walltime=00:30:00
#PBS -q main
#PBS -l select=2:ncpus=128:mpiprocs=4:ompthreads=32
mpiexec --cpu-bind depth -n 8 -ppn 4 -d 32 ./executable_name
