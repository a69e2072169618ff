#!/bin/bash
# Submitted held, not rerunnable.
#PBS -h
#PBS -r n
#PBS -l select=1:ncpus=1
#PBS -l walltime=00:01:00
./once
