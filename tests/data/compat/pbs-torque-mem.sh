#!/bin/bash
# One node, job memory, a walltime in MM:SS.
#PBS -l nodes=1:ppn=8
#PBS -l mem=32gb
#PBS -l walltime=10:00
cd $PBS_O_WORKDIR
./threaded
