#!/bin/bash
# One job of this name and user at a time.
#SBATCH -J chain
#SBATCH -d singleton
#SBATCH -n 1
#SBATCH -t 5
./step
