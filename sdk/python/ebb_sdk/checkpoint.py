"""Atomic checkpoints in the job's checkpoint directory, which survives its
attempts: write to a temporary file, fsync, rename, fsync the directory;
keep the last K; report each to the attempt's endpoint so Ebb can pick
victims by it and account lost work; find the latest complete one on
resume. And the completion marker, so that an exit during a drain is not
mistaken for success."""

import json
import os
import re
import signal
import sys
import time
import urllib.request
from typing import Any, BinaryIO, Callable, List, NamedTuple, Optional, Union

from . import drain
from ._env import checkpoint_interval, in_ebb

Writer = Union[bytes, Callable[[BinaryIO], Any]]


class Checkpoint(NamedTuple):
    step: int
    path: str


def report_checkpoint(step: Optional[int] = None, size: Optional[int] = None, seconds: float = 0.0) -> bool:
    """Tells Ebb a checkpoint is complete (for checkpoints not written by
    `CheckpointManager`). Returns False outside Ebb or if the agent could
    not be told; never raises."""
    url = os.environ.get("EBB_METADATA_URL")
    if not in_ebb() or not url:
        return False
    body = json.dumps({"step": step, "bytes": size, "seconds": max(0.0, float(seconds))}).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/ebb/v1/checkpoint",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return 200 <= resp.status < 300
    except OSError as e:
        print(f"ebb_sdk: checkpoint report not delivered: {e}", file=sys.stderr)
        return False


def complete() -> None:
    """Marks the job's work as done. Call it just before exiting 0 when
    the job has finished: an exit during a drain without the marker is a
    preemption (requeued), with it a success.

    From here on the drain signal is ignored: a notice that arrives while
    the process exits must not kill it by a signal (Python restores the
    default handlers during its teardown), which would turn finished work
    into a preemption and run it again."""
    path = os.environ.get("EBB_COMPLETION_FILE")
    if not path:
        return
    try:
        signal.signal(int(os.environ.get("EBB_DRAIN_SIGNAL", signal.SIGTERM)), signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread: the handler (if any) stays, and only sets a flag
    with open(path, "w", encoding="utf-8") as f:
        f.write("complete\n")
        f.flush()
        os.fsync(f.fileno())


def exit_now(code: int = 0) -> None:
    """Exits at once, skipping the interpreter's teardown (which takes a
    few hundred milliseconds with large libraries loaded): after a save on
    notice, every moment until the exit is GPU time held and work counted
    as lost. Flushes stdout and stderr first. Without `complete()` before
    it, the exit is a preemption and the job is requeued."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Checkpoints named `<prefix>-<step>.ckpt` in `directory` (default
    `$EBB_CHECKPOINT_DIR`, or `./checkpoints` outside Ebb).

    `save(step, data)` takes bytes, or a function that writes to a binary
    file object (`lambda f: torch.save(state, f)`, `lambda f: np.savez(f,
    ...)`). A file is visible under its final name only once it is complete
    and on disk, so `latest()` never returns a torn checkpoint.
    """

    _NAME = re.compile(r"^(?P<prefix>.+)-(?P<step>\d{12})\.ckpt$")

    def __init__(
        self,
        directory: Optional[str] = None,
        keep: int = 3,
        prefix: str = "ckpt",
        interval: Optional[float] = None,
        report: bool = True,
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"prefix {prefix!r}: letters, digits, '_' and '.' only")
        self.directory = directory or os.environ.get("EBB_CHECKPOINT_DIR") or "checkpoints"
        os.makedirs(self.directory, exist_ok=True)
        self.keep = keep
        self.prefix = prefix
        self.interval = interval if interval is not None else checkpoint_interval()
        self.report = report
        self.last_seconds: Optional[float] = None
        self._last_save = time.monotonic()
        # The drain signal's handler goes in now, on the main thread.
        self.watcher = drain.watcher()
        self._clean_temporaries()

    def path_for(self, step: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-{step:012d}.ckpt")

    def save(self, step: int, data: Writer) -> str:
        """Writes checkpoint `step` atomically, keeps the last K, reports it.
        Returns its path."""
        if step < 0:
            raise ValueError("step must be non-negative")
        started = time.monotonic()
        final = self.path_for(step)
        tmp = os.path.join(self.directory, f".{os.path.basename(final)}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    f.write(data)
                else:
                    data(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        seconds = time.monotonic() - started
        self.last_seconds = seconds
        self._last_save = time.monotonic()
        self._prune()
        if self.report:
            report_checkpoint(step, os.path.getsize(final), seconds)
        return final

    def checkpoints(self) -> List[Checkpoint]:
        """Complete checkpoints, oldest first."""
        found = []
        for name in os.listdir(self.directory):
            m = self._NAME.match(name)
            if m and m.group("prefix") == self.prefix:
                found.append(Checkpoint(int(m.group("step")), os.path.join(self.directory, name)))
        return sorted(found)

    def latest(self) -> Optional[Checkpoint]:
        """The newest complete checkpoint, or None on a first start."""
        found = self.checkpoints()
        return found[-1] if found else None

    def load_latest(self, read: Callable[[BinaryIO], Any]) -> Optional[tuple]:
        """`(step, read(file))` of the newest checkpoint, or None."""
        latest = self.latest()
        if latest is None:
            return None
        with open(latest.path, "rb") as f:
            return latest.step, read(f)

    def should_save(self) -> bool:
        """True when a drain was requested, or the periodic interval has
        passed since the last save."""
        if self.watcher.drain_requested():
            return True
        return self.interval is not None and time.monotonic() - self._last_save >= self.interval

    def drain_requested(self) -> bool:
        return self.watcher.drain_requested()

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep]:
            try:
                os.unlink(old.path)
            except FileNotFoundError:
                pass

    def _clean_temporaries(self) -> None:
        """Leftovers of saves that a kill interrupted."""
        for name in os.listdir(self.directory):
            if name.startswith(f".{self.prefix}-") and ".tmp-" in name:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass
