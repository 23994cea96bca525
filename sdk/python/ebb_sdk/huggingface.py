"""Hugging Face `Trainer`: a callback that saves and stops when the drain
comes, saves on Ebb's recommended interval, reports each checkpoint, and
reports the resume when training starts from a checkpoint.

`Trainer` writes the checkpoints itself, one `checkpoint-N` directory per
step that all ranks of a gang share, and prunes them (`save_total_limit`)
from its main process; this module neither writes nor deletes any. In a
gang every rank's callback sees each save, and the world's main process
alone reports it: Ebb counts each report as one checkpoint.

    from ebb_sdk.huggingface import EbbCallback, last_checkpoint
    args = TrainingArguments(output_dir=os.environ["EBB_CHECKPOINT_DIR"], ...)
    trainer = Trainer(..., args=args, callbacks=[EbbCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
    if not ebb_sdk.drain_requested():
        ebb_sdk.complete()

Import this module only where `transformers` is installed.
"""

import os
import re
import time
from typing import Optional

from transformers import TrainerCallback

from . import drain
from ._env import checkpoint_interval, rank
from .checkpoint import note_attempt, report_checkpoint, report_resumed

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(output_dir: str) -> Optional[str]:
    """The newest complete `checkpoint-N` directory under `output_dir`:
    `Trainer` writes `trainer_state.json` last, so a directory without it
    was cut short and is skipped. None on a first start."""
    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isfile(os.path.join(path, "trainer_state.json")):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def _size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


class EbbCallback(TrainerCallback):
    """On the drain: save now and stop training. Otherwise save every
    `interval` seconds (default: `EBB_CHECKPOINT_INTERVAL_S`)."""

    def __init__(self, interval: Optional[float] = None):
        self.interval = interval if interval is not None else checkpoint_interval()
        self.watcher = drain.watcher()
        self._last_save = time.monotonic()
        self._save_started: Optional[float] = None

    def on_train_begin(self, args, state, control, **kwargs):
        # `Trainer` has loaded the checkpoint's state by now: a step above
        # zero is the one it resumed from.
        if not self._main(state):
            return control
        if state.global_step > 0:
            report_resumed(state.global_step)
        note_attempt(state.global_step if state.global_step > 0 else None)
        return control

    @staticmethod
    def _main(state) -> bool:
        main = getattr(state, "is_world_process_zero", None)
        return rank() == 0 if main is None else main

    def on_step_end(self, args, state, control, **kwargs):
        due = self.interval is not None and time.monotonic() - self._last_save >= self.interval
        if self.watcher.drain_requested():
            control.should_save = True
            control.should_training_stop = True
        elif due:
            control.should_save = True
        if control.should_save:
            self._save_started = time.monotonic()
        return control

    def on_save(self, args, state, control, **kwargs):
        now = time.monotonic()
        seconds = now - self._save_started if self._save_started is not None else 0.0
        self._save_started = None
        self._last_save = now
        if not self._main(state):
            return control
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        report_checkpoint(state.global_step, _size(path) if os.path.isdir(path) else None, seconds)
        return control
