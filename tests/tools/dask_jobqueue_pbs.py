"""dask-jobqueue's PBSCluster (and SLURMCluster) driving berth through qsub/qdel (sbatch/scancel).

Run by crates/cli/tests/system_real_tools.rs with berth's PBS and Slurm command links first
on PATH. dask-jobqueue writes `#PBS -l select=1:ncpus=1:mem=1GB`, `#PBS -l walltime=...`,
`#PBS -o DIR/` batch scripts that start a dask worker connecting back to this process's
scheduler; the worker computes a sum; closing the cluster deletes the jobs (qdel).
Usage: python dask_jobqueue_pbs.py pbs|slurm LOGDIR
"""
import sys

import dask_jobqueue
from dask_jobqueue import PBSCluster, SLURMCluster
from distributed import Client

dialect, logdir = sys.argv[1], sys.argv[2]
common = dict(cores=1, processes=1, memory="1GB", walltime="00:10:00", queue="batch",
              log_directory=logdir, local_directory=logdir)
if dialect == "pbs":
    cluster = PBSCluster(resource_spec="select=1:ncpus=1:mem=1GB", **common)
else:
    cluster = SLURMCluster(**common)
print(cluster.job_script(), flush=True)
cluster.scale(jobs=1)
client = Client(cluster)
client.wait_for_workers(1, timeout=60)
total = client.submit(sum, [1, 2, 3, 36]).result(timeout=60)
print("result", total, flush=True)
assert total == 42, total
squares = client.gather(client.map(lambda x: x * x, range(5)))
assert squares == [0, 1, 4, 9, 16], squares
client.close()
cluster.close()
print("dask-jobqueue ok", dialect, dask_jobqueue.__version__, flush=True)
