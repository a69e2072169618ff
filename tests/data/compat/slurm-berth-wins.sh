#!/bin/bash
# #BERTH lines win over #SBATCH ones.
#SBATCH -J from-slurm
#SBATCH -t 10
#SBATCH -n 2
#BERTH --name from-berth --walltime 00:05:00
./a.out
