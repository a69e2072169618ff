#!/bin/bash
# The same NCAR-style script with --ignore-unsupported.
#PBS -N mpi_job
#PBS -A UABC0001
#PBS -l walltime=01:00:00
#PBS -q main
#PBS -j oe
#PBS -k eod
#PBS -l select=2:ncpus=128:mpiprocs=128
mpiexec ./executable_name
