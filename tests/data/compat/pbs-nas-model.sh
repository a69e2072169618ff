#!/bin/csh
# NASA HECC style: model= picks a processor type, group_list charges a group; -S names the #! shell.
#PBS -S /bin/csh
#PBS -N cfd
#PBS -l select=4:ncpus=28:mpiprocs=28:model=bro
#PBS -l walltime=8:00:00
#PBS -q long
#PBS -W group_list=a0801
#PBS -m e
cd $PBS_O_WORKDIR
mpiexec ./a.out
