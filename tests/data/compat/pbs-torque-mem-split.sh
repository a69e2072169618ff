#!/bin/bash
# -l mem is the job's total: berth asks a quarter of it on each of four nodes.
#PBS -l nodes=4:ppn=2
#PBS -l mem=16gb
#PBS -l walltime=00:20:00
mpirun ./a.out
