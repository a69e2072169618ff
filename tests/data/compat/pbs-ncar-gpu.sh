#!/bin/bash
# A GPU request in a select chunk: rejected until berth schedules GPUs.
#PBS -N gpu_job
#PBS -A UABC0001
#PBS -l walltime=00:10:00
#PBS -q main
#PBS -l select=1:ncpus=64:mpiprocs=4:ngpus=4
mpiexec ./gpu_exe
