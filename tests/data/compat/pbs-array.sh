#!/bin/bash
# A PBS Pro array with a step.
#PBS -N sweep
#PBS -J 1-10:2
#PBS -l select=1:ncpus=1
#PBS -l walltime=00:10:00
./sweep $PBS_ARRAY_INDEX
