#!/bin/bash
# place=pack (every chunk on one host) is not supported.
#PBS -l select=2:ncpus=4
#PBS -l place=pack
./a.out
