#!/bin/bash
# A shared-node job with memory in the chunk (Casper style).
#PBS -N serial_job
#PBS -A UABC0001
#PBS -l select=1:ncpus=1:mem=10GB
#PBS -l walltime=01:00:00
#PBS -q casper
./executable_name
