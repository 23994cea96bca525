"""What Ebb tells every attempt, read from the environment."""

import json
import os
from typing import Dict, Optional


def in_ebb() -> bool:
    """True inside an attempt that Ebb started (and only there)."""
    return bool(os.environ.get("EBB_JOB_ID")) and bool(os.environ.get("EBB_ATTEMPT"))


def job_id() -> Optional[int]:
    value = os.environ.get("EBB_JOB_ID")
    return int(value) if value else None


def attempt() -> Optional[int]:
    value = os.environ.get("EBB_ATTEMPT")
    return int(value) if value else None


def run_id() -> Optional[str]:
    """`EBB_RUN_ID`: the job's one run across all its attempts, for an
    experiment tracker (Weights & Biases is given it as `WANDB_RUN_ID`)."""
    return os.environ.get("EBB_RUN_ID") or None


def task_index() -> Optional[int]:
    """`EBB_TASK_INDEX` of an array or sweep task."""
    value = os.environ.get("EBB_TASK_INDEX")
    return int(value) if value else None


def task_count() -> Optional[int]:
    value = os.environ.get("EBB_TASK_COUNT")
    return int(value) if value else None


def params() -> Dict[str, str]:
    """A sweep task's parameters (`EBB_PARAMS`), values as given."""
    value = os.environ.get("EBB_PARAMS")
    return json.loads(value) if value else {}


def checkpoint_interval() -> Optional[float]:
    """Seconds between periodic checkpoints that Ebb recommends
    (`EBB_CHECKPOINT_INTERVAL_S`, Young/Daly), or None outside Ebb."""
    value = os.environ.get("EBB_CHECKPOINT_INTERVAL_S")
    return float(value) if value else None


def rank() -> int:
    """This process's rank in its gang; 0 outside one. `RANK` where a
    launcher such as torchrun started one process per GPU; without it,
    `NODE_RANK`, for a command that Ebb started once on each node."""
    value = os.environ.get("RANK")
    if value:
        return int(value)
    value = os.environ.get("NODE_RANK")
    return int(value) if value and os.environ.get("NNODES") else 0


def world_size() -> int:
    """How many ranks the gang has; 1 outside one. `WORLD_SIZE` where
    `RANK` is set; without `RANK`, `NNODES`, one process per node (Ebb's
    own `WORLD_SIZE` counts GPUs, not the processes it started)."""
    if os.environ.get("RANK"):
        value = os.environ.get("WORLD_SIZE")
        return int(value) if value else 1
    value = os.environ.get("NNODES")
    return int(value) if value and os.environ.get("NODE_RANK") else 1
