#!/bin/bash
# NCAR Derecho style with stderr joined into the output file (-j oe), named by -o.
#PBS -N join_job
#PBS -A UABC0001
#PBS -l walltime=00:20:00
#PBS -q main
#PBS -j oe
#PBS -o logs/join_job.log
#PBS -l select=1:ncpus=64:mpiprocs=64
mpiexec ./executable_name
