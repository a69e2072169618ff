#!/bin/bash
# A custom resource with a count of 0: refused, naming it.
#PBS -l select=2:ncpus=4:nvme=0
#PBS -l walltime=00:10:00
./run
