#!/bin/bash
# Several unsupported directives, each a warning with its line.
#SBATCH -n 4
#SBATCH --licenses=matlab:1
#SBATCH --gres=gpu:2 --exclusive=user
#SBATCH -t 30
matlab -batch run
