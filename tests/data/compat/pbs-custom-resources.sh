#!/bin/bash
# Site-defined PBS resources: a host-level one in the chunk (local NVMe) and a server-level
# one job-wide (MATLAB licenses).
#PBS -N matlab_nvme
#PBS -l select=1:ncpus=2:nvme=10
#PBS -l matlab=2
#PBS -l walltime=01:00:00
matlab -batch run
