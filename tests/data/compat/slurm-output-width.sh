#!/bin/bash
# A padded pattern (%4j) is not supported.
#SBATCH -n 1
#SBATCH -o out-%4j.txt
hostname
