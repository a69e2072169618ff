#!/bin/bash
# GPU and local NVMe as generic resources (CSC style): both read.
#SBATCH --job-name=gpu
#SBATCH --account=project_2001234
#SBATCH --partition=gpu
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=10
#SBATCH --time=1:00:00
#SBATCH --gres=gpu:v100:1,nvme:10

srun myprog
