#!/bin/bash
# A list of partitions: berth takes one queue.
#SBATCH -p short,long
#SBATCH -n 1
./a.out
