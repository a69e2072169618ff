#!/bin/bash
# A whole-node MPI job as Niagara-style sites ask for it: nodes and ranks per node only.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=40
#SBATCH --time=1:00:00
#SBATCH --job-name=mpi_job
#SBATCH --output=mpi_output_%j.txt
#SBATCH --mail-type=FAIL
cd $SLURM_SUBMIT_DIR
mpirun ./mpi_example
