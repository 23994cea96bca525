"""Ebb's job SDK: know when your preemptible attempt is being drained,
checkpoint atomically, resume from the latest complete checkpoint, and tell
Ebb when the work is done.

    import ebb_sdk
    ckpt = ebb_sdk.CheckpointManager(keep=3)
    step, state = ckpt.load_latest(read) or (0, fresh_state())
    while step < total:
        state = train_step(state); step += 1
        if ckpt.should_save():          # the drain came, or the interval passed
            ckpt.save(step, lambda f: write(state, f))
        if ebb_sdk.drain_requested():
            ebb_sdk.exit_now()          # requeued: no completion marker
    ebb_sdk.complete()                  # success, even during a drain

An elastic job (`--gpus MIN:MAX`) saves once when its nodes change,
`should_save()` saying so, and its ranks then exit for torchrun to re-form
them: see `ebb_sdk.elastic`.

A job with a deadline reports how far it has got, `ebb_sdk.progress(step /
total)`, so that Ebb moves it to on-demand only when it would be late.

From a notebook, `ebb_sdk.drill(job_id)` runs a fire drill of a running
job's drain (as `ebb drill` does) and returns its report.

No required dependencies. PyTorch and Hugging Face helpers live in
`ebb_sdk.pytorch` and `ebb_sdk.huggingface`, imported only by the jobs that
use those libraries.
"""

from ._env import (
    attempt,
    checkpoint_interval,
    in_ebb,
    job_id,
    params,
    rank,
    run_id,
    task_count,
    task_index,
    world_size,
)
from .checkpoint import (
    Checkpoint,
    CheckpointManager,
    complete,
    exit_now,
    note_attempt,
    progress,
    report_checkpoint,
    report_resumed,
)
from .drain import DrainWatcher, Notice, drain_requested, notice, on_drain, watcher
from .elastic import Members, gpu_range, members
from .drills import DrillError, drill

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "DrainWatcher",
    "DrillError",
    "Members",
    "Notice",
    "attempt",
    "checkpoint_interval",
    "complete",
    "drill",
    "drain_requested",
    "exit_now",
    "gpu_range",
    "in_ebb",
    "job_id",
    "members",
    "note_attempt",
    "notice",
    "on_drain",
    "params",
    "progress",
    "rank",
    "report_checkpoint",
    "report_resumed",
    "run_id",
    "task_count",
    "task_index",
    "watcher",
    "world_size",
]

__version__ = "0.1.0"
