#!/bin/bash
# SuperMUC-NG style: nodes and ranks per node, no-requeue, account.
#SBATCH -J sng_job
#SBATCH -o ./%x.%j.out
#SBATCH -D ./
#SBATCH --no-requeue
#SBATCH --time=00:30:00
#SBATCH --partition=micro
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=48
#SBATCH --account=pn12ab
module load slurm_setup
mpiexec -n $SLURM_NTASKS ./myprog.exe
