#!/bin/bash
# One chunk per node, nodes not shared.
#PBS -l select=3:ncpus=8:mpiprocs=8
#PBS -l place=scatter:excl
#PBS -l walltime=02:00:00
mpiexec ./a.out
