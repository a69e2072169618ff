#!/bin/bash
# Runs after job 4242 on server pbs01 has succeeded.
#PBS -W depend=afterok:4242.pbs01
#PBS -l select=1:ncpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
mpiexec ./post
