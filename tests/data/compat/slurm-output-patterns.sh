#!/bin/bash
# Output patterns: job name, id, user, first node, node index, task id and a literal percent.
#SBATCH -J patterns
#SBATCH -o %x-%j-%u.out
#SBATCH -e %x-%N-%n-%t-100%%.err
#SBATCH -n 1
#SBATCH -t 5
hostname
