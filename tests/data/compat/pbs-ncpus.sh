#!/bin/bash
# A core count with no chunks.
#PBS -l ncpus=4
#PBS -l walltime=3600
./threaded
