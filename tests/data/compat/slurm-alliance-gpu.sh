#!/bin/bash
# A GPU request Alliance-style: rejected until berth schedules GPUs.
#SBATCH --account=def-someuser
#SBATCH --gpus-per-node=2
#SBATCH --mem=4000M
#SBATCH --time=0-03:00
nvidia-smi
