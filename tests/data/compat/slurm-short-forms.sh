#!/bin/bash
# Short options written against their values, as getopt allows.
#SBATCH -N1 -n4 -c2 -t30 -Jshort
srun ./a.out
