#!/bin/csh
# The NASA-style script with --ignore-unsupported: each unsupported part is a warning.
#PBS -S /bin/csh
#PBS -N cfd
#PBS -l select=4:ncpus=28:mpiprocs=28:model=bro
#PBS -l walltime=8:00:00
#PBS -q long
#PBS -W group_list=a0801
#PBS -m e
cd $PBS_O_WORKDIR
mpiexec ./a.out
