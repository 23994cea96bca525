"""PyTorch: checkpoint model, optimizer (and scheduler), step and every RNG
state, so a resumed run continues exactly where the saved one was.

    from ebb_sdk import CheckpointManager
    from ebb_sdk.pytorch import save, restore
    ckpt = CheckpointManager()
    step = restore(ckpt, model, optimizer)        # 0 on a first start
    ...
    if ckpt.should_save():
        save(ckpt, step, model, optimizer)

In a gang, each rank calls `save` and `restore` with its own manager:
each saves its own part (its model shard or replica, its optimizer state,
its RNG states, which differ between ranks) and restores its own part of
the newest step that every rank saved.

Import this module only where PyTorch is installed.
"""

import random
from typing import Any, Optional

import torch

from .checkpoint import CheckpointManager, note_attempt

try:  # numpy's global RNG too, when numpy is there
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is optional
    _np = None


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if _np is not None:
        state["numpy"] = _np.random.get_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state and _np is not None:
        _np.random.set_state(state["numpy"])


def save(
    manager: CheckpointManager,
    step: int,
    model: Any,
    optimizer: Optional[Any] = None,
    scheduler: Optional[Any] = None,
    extra: Optional[dict] = None,
) -> str:
    """Saves `step`, the model's and optimizer's (and scheduler's) state
    dicts, the RNG states and `extra` as one atomic checkpoint (this rank's
    part of it, in a gang)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(),
        "extra": extra or {},
    }
    return manager.save(step, lambda f: torch.save(state, f))


def restore(
    manager: CheckpointManager,
    model: Any,
    optimizer: Optional[Any] = None,
    scheduler: Optional[Any] = None,
    map_location: Any = None,
) -> int:
    """Loads the latest complete checkpoint (this rank's part of it, in a
    gang) into `model` (and `optimizer`, `scheduler`), restores the RNG
    states, reports the resume and returns the step to continue from; 0
    when there is none.
    `manager.extra` holds what `save` got as `extra`."""
    latest = manager.latest()
    manager.extra = {}
    if latest is None:
        if manager.report and manager.rank == 0:
            note_attempt(None)
        return 0
    with open(latest.path, "rb") as f:
        state = torch.load(f, map_location=map_location, weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    manager.extra = state.get("extra") or {}
    manager.resumed(int(state["step"]))
    return int(state["step"])
