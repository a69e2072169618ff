#!/bin/bash
# Hybrid job in TACC style: -n is the total rank count, threads set by hand.
#SBATCH -J hybrid
#SBATCH -o hybrid.o%j
#SBATCH -p normal
#SBATCH -N 2
#SBATCH -n 8
#SBATCH -t 00:45:00

export OMP_NUM_THREADS=16
ibrun ./hybrid.exe
