#!/bin/bash
# NCAR Derecho style: -j oe (read) and -k eod (a PBS option berth lacks).
#PBS -N mpi_job
#PBS -A UABC0001
#PBS -l walltime=01:00:00
#PBS -q main
#PBS -j oe
#PBS -k eod
#PBS -l select=2:ncpus=128:mpiprocs=128
export TMPDIR=/glade/derecho/scratch/$USER/temp
mpiexec ./executable_name
