#!/bin/bash
# Torque's gpus= node property: rejected until berth schedules GPUs.
#PBS -l nodes=1:ppn=4:gpus=2
#PBS -l walltime=01:00:00
./gpu
