#!/bin/bash
# One core for a serial code (TACC style, -N 1 -n 1).
#SBATCH -J serial
#SBATCH -o serial.o%j
#SBATCH -e serial.e%j
#SBATCH -p development
#SBATCH -N 1
#SBATCH -n 1
#SBATCH -t 00:05:00
#SBATCH -A myproject

./serial.exe
