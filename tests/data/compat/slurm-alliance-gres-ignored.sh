#!/bin/bash
# The same kind of request, submitted with --ignore-unsupported: a warning, and the job without GPUs.
#SBATCH --account=def-someuser
#SBATCH --gres=gpu:v100:1
#SBATCH --cpus-per-task=6
#SBATCH --mem=32000M
#SBATCH --time=0-01:00
python train.py
