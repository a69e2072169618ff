#!/bin/bash
# Comment, signal, requeue, mail and export.
#SBATCH --comment="nightly run"
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --mail-type=BEGIN,END,FAIL
#SBATCH --mail-user=ops@example.org
#SBATCH --export=ALL,FOO=bar
#SBATCH -n 1
#SBATCH -t 1:00:00
./nightly
