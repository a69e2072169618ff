#!/bin/bash
# Mail on abort, begin and end; the whole environment plus one variable.
#PBS -m abe
#PBS -M user@example.org
#PBS -V
#PBS -v FOO=bar
#PBS -l select=1:ncpus=2:mpiprocs=2
#PBS -l walltime=00:05:00
mpiexec ./a.out
