#!/bin/bash
#SBATCH --job-name=c4-7b
#SBATCH --account=project_462000229
#SBATCH --output=/pfs/lustref1/flash/project_462000229/logs/%j.log
#SBATCH --nodes=8               # Total number of nodes 
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8       # Allocate one gpu per MPI rank
#SBATCH --cpus-per-task=6       # 6 threads per rank
#SBATCH --time=00:15:00
#SBATCH --mem=0			# All memory on the node
#SBATCH --partition=standard-g
