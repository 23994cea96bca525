"""Experiment trackers that keep one run across a job's attempts.

Weights & Biases needs nothing here: every attempt gets `WANDB_RUN_ID`
(the job's `EBB_RUN_ID`) and `WANDB_RESUME=allow`, so a bare
`wandb.init()` resumes the job's run. MLflow's client resumes the run
`MLFLOW_RUN_ID` names only if its tracking server already has it, and the
server draws the id, so Ebb cannot name it ahead: `start_mlflow_run`
starts the job's run on its first attempt, tagged with `EBB_RUN_ID`, and
finds it by that tag on the attempts after it. Nothing is kept on the
node, so an attempt on another node (a node-local checkpoint directory)
finds the run too. Imported only by jobs that use MLflow."""

import os
import re
from typing import Any

import mlflow

from ._env import run_id

#: The tag that names the job's run.
TAG = "ebb.run_id"


def start_mlflow_run(**kwargs: Any) -> "mlflow.ActiveRun":
    """`mlflow.start_run(**kwargs)` that keeps one run across the job's
    attempts: the first starts a run named and tagged `EBB_RUN_ID`, each
    later one resumes the run with that tag (looked for in every
    experiment: the id names one job of one cluster). Outside Ebb, or
    given `run_id` or `MLFLOW_RUN_ID`, it is `mlflow.start_run(**kwargs)`
    unchanged. In a gang, call it from one rank (rank 0), as trackers are
    used."""
    ebb_run = run_id()
    # Ebb's ids are letters, digits and dashes: anything else is not one
    # (and would not be safe in the search's filter).
    if not ebb_run or not re.fullmatch(r"[a-z0-9-]+", ebb_run):
        return mlflow.start_run(**kwargs)
    if "run_id" in kwargs or os.environ.get("MLFLOW_RUN_ID"):
        return mlflow.start_run(**kwargs)
    found = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.`{TAG}` = '{ebb_run}'",
        max_results=1,
        output_format="list",
    )
    if found:
        kwargs.pop("run_name", None)
        kwargs.pop("tags", None)
        kwargs.pop("experiment_id", None)
        return mlflow.start_run(run_id=found[0].info.run_id, **kwargs)
    kwargs.setdefault("run_name", ebb_run)
    tags = dict(kwargs.pop("tags", None) or {})
    tags[TAG] = ebb_run
    return mlflow.start_run(tags=tags, **kwargs)
