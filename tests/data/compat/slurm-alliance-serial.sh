#!/bin/bash
#SBATCH --time=0-03:00
#SBATCH --account=def-someuser
#SBATCH --mem-per-cpu=1500M
echo 'Hello, world!'
sleep 30
