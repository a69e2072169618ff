#!/bin/bash
# No time limit: berth has none to give, so it is unsupported.
#SBATCH -n 1
#SBATCH --time=UNLIMITED
./forever
