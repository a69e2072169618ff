#!/bin/bash
# A typed generic resource (local scratch of a kind): read by its type.
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --time=00:30:00
#SBATCH --gres=lscratch:ssd:100

srun ./stage-and-run.sh
