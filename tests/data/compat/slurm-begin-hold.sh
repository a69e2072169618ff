#!/bin/bash
# Not before an hour from now, and held until released.
#SBATCH --begin=now+1hour
#SBATCH -H
#SBATCH -n 1
#SBATCH -t 5
./later
