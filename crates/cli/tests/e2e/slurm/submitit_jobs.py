"""submitit, unchanged from PyPI, against an Ebb cluster through its Slurm
commands: a function's result, map_array over 20 inputs, a Checkpointable
job preempted twice by on-demand work that resumes from its checkpoint each
time and returns what an uninterrupted run returns, and a cancelled job
reported as cancelled. Run by the end-to-end test `slurm::submitit` with
the job folder and the `ebb` program; the cluster's node has 4 GPUs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import submitit

FOLDER = Path(sys.argv[1])
EBB = sys.argv[2]
STEPS = 150


def add(a, b):
    return a + b


class Count(submitit.helpers.Checkpointable):
    """Sums i*i for i below `steps`, a step each 40 ms, writing where it is
    (and in which attempt) to `progress`."""

    def __init__(self):
        self.done = 0
        self.total = 0

    def __call__(self, steps, progress):
        attempt = os.environ["SLURM_RESTART_COUNT"]
        with open(progress, "a") as out:
            while self.done < steps:
                out.write(f"{attempt} {self.done}\n")
                out.flush()
                time.sleep(0.04)
                self.total += self.done * self.done
                self.done += 1
        return self.total


def progress(path):
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line.strip()]


def wait(what, check, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def preempt():
    """On-demand work that needs the whole node: the preemptible job drains."""
    out = subprocess.run(
        [EBB, "submit", "--json", "--tier", "on-demand", "--gpus", "4", "--", "sleep", "1"],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)["id"]


executor = submitit.AutoExecutor(folder=FOLDER / "%j")
executor.update_parameters(timeout_min=60, slurm_gpus_per_node=1)
assert executor.cluster == "slurm", executor.cluster

job = executor.submit(add, 2, 3)
assert job.result() == 5, job.result()
print("result", job.job_id, job.result())

jobs = executor.map_array(add, list(range(20)), list(range(20, 40)))
results = [j.result() for j in jobs]
assert results == [a + b for a, b in zip(range(20), range(20, 40))], results
assert all("_" in j.job_id for j in jobs), [j.job_id for j in jobs]
print("array", jobs[0].job_id.split("_")[0], results)

steps_file = FOLDER / "count.progress"
job = executor.submit(Count(), STEPS, str(steps_file))
for attempt, at in ((0, 30), (1, 70)):
    # Preempted while it runs, once it has done `at` steps in this attempt.
    wait(f"attempt {attempt} at step {at}", lambda: any(a == attempt and d >= at for a, d in progress(steps_file)))
    preempt()
    wait(f"attempt {attempt + 1}", lambda: any(a == attempt + 1 for a, _ in progress(steps_file)))
total = job.result()
assert total == sum(i * i for i in range(STEPS)), total
seen = progress(steps_file)
for attempt in (1, 2):
    first = next(d for a, d in seen if a == attempt)
    assert first > 0, f"attempt {attempt} started from scratch: {seen}"
print("checkpointable", job.job_id, total, [next(d for a, d in seen if a == n) for n in (0, 1, 2)])

sleeper = executor.submit(time.sleep, 600)
wait("the sleeper to run", lambda: sleeper.watcher.get_state(sleeper.job_id, mode="force") == "RUNNING")
sleeper.cancel()
wait("the cancel", lambda: sleeper.watcher.get_state(sleeper.job_id, mode="force") == "CANCELLED")
print("cancelled", sleeper.job_id, sleeper.state)
