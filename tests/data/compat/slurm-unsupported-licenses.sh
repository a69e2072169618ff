#!/bin/bash
# A license request: berth has no licenses.
#SBATCH -n 4
#SBATCH -t 30
#SBATCH --licenses=matlab:1
matlab -batch run
