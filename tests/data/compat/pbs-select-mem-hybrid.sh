#!/bin/bash
# Chunk memory and several CPUs per rank.
#PBS -N chunkmem
#PBS -l select=2:ncpus=36:mpiprocs=6:mem=100gb
#PBS -l walltime=12:00:00
mpiexec ./a.out
