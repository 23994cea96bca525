"""dask-jobqueue, unchanged from PyPI, against an Ebb cluster through its
Slurm commands: SLURMCluster.scale(2) gets two workers that compute a
result, and close() cancels their jobs. Run by the end-to-end test
`slurm::dask_jobqueue_and_simple_slurm`; prints the workers' job ids."""

import sys

from dask.distributed import Client
from dask_jobqueue import SLURMCluster

logs = sys.argv[1]
cluster = SLURMCluster(
    cores=1,
    memory="1GB",
    processes=1,
    walltime="00:10:00",
    python=sys.executable,
    log_directory=logs,
    scheduler_options={"host": "127.0.0.1"},
    worker_extra_args=["--host", "127.0.0.1"],
)
print(cluster.job_script(), file=sys.stderr)
cluster.scale(2)
client = Client(cluster)
client.wait_for_workers(2, timeout=120)
futures = client.map(lambda x: x * x, range(10))
assert client.gather(futures) == [x * x for x in range(10)]
ids = sorted(cluster.workers[name].job_id for name in cluster.workers)
assert len(ids) == 2, ids
client.close()
cluster.close()
print(" ".join(ids))
