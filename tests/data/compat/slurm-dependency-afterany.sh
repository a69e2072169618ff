#!/bin/bash
# After two jobs have ended, whatever their outcome.
#SBATCH --dependency=afterany:4242:4243
#SBATCH -n 1
#SBATCH -t 5
./cleanup
