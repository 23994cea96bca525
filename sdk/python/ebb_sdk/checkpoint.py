"""Atomic checkpoints in the job's checkpoint directory, which survives its
attempts: write to a temporary file, fsync, rename, fsync the directory;
keep the last K; report each to the attempt's endpoint so Ebb can pick
victims by it and account lost work; find the latest complete one on
resume. And the completion marker, so that an exit during a drain is not
mistaken for success.

In a gang every rank shares the one directory. Each rank writes its own
part of a step, and a step is complete only once every rank's part is
there: a resume never pairs one rank's new state with another's missing
or older one. A rank deletes only files it wrote itself."""

import json
import logging
import os
import re
import signal
import sys
import time
import urllib.request
from typing import Any, BinaryIO, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from . import drain, elastic
from ._env import attempt as _env_attempt
from ._env import checkpoint_interval, in_ebb
from ._env import job_id as _env_job_id
from ._env import run_id as _env_run_id
from ._env import rank as _env_rank
from ._env import world_size as _env_world_size

Writer = Union[bytes, Callable[[BinaryIO], Any]]


class Checkpoint(NamedTuple):
    """A complete step, and the file this process reads it from: its own
    part in a gang, the step's single file otherwise."""

    step: int
    path: str


def _post(path: str, what: str, body: dict) -> bool:
    """Posts `body` to the attempt's endpoint; False outside Ebb or if the
    agent could not be told. Never raises."""
    url = os.environ.get("EBB_METADATA_URL")
    if not in_ebb() or not url:
        return False
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return 200 <= resp.status < 300
    except OSError as e:
        print(f"ebb_sdk: {what} not delivered: {e}", file=sys.stderr)
        return False


def report_checkpoint(step: Optional[int] = None, size: Optional[int] = None, seconds: float = 0.0) -> bool:
    """Tells Ebb a checkpoint is complete (for checkpoints not written by
    `CheckpointManager`). Returns False outside Ebb or if the agent could
    not be told; never raises."""
    body = {"step": step, "bytes": size, "seconds": max(0.0, float(seconds))}
    return _post("/ebb/v1/checkpoint", "checkpoint report", body)


def progress(fraction: float) -> bool:
    """Tells Ebb how much of the job is done, a fraction from 0 to 1
    (e.g. steps done over steps in all). A job submitted with a deadline
    (`ebb submit --deadline`) is judged by it: it stays preemptible while
    the rest fits before the deadline and moves to on-demand once it would
    not. Report it every few minutes, or with each checkpoint. Returns
    False outside Ebb or if the agent could not be told; never raises
    (a fraction outside 0..1 raises ValueError: that is a bug in the job)."""
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"progress: the fraction done must be from 0 to 1, got {fraction}")
    return _post("/ebb/v1/progress", "progress report", {"fraction": fraction})


def report_resumed(step: Optional[int] = None) -> bool:
    """Tells Ebb this attempt resumed from the checkpoint of `step` (for
    restores not done by `CheckpointManager.load_latest` or the
    integrations, which say it themselves). A drill (`ebb drill`) waits
    for it: it is how Ebb knows the work resumed rather than started over.
    Returns False outside Ebb or if the agent could not be told; never
    raises."""
    return _post("/ebb/v1/resumed", "resume report", {"step": step})


def note_attempt(resumed_step: Optional[int] = None) -> None:
    """Says which attempt this is, and the step it resumed from, where a
    person reading the run will look: the `ebb_sdk` logger, and the
    active Weights & Biases run if there is one (its summary's
    `ebb/attempt`, `ebb/resumed_step` and `ebb/run_id`, and `ebb_run_id`
    in its config), so that one run across attempts shows where each
    began. The resume helpers call it; outside Ebb it does nothing; it
    never raises."""
    if not in_ebb():
        return
    job, number, run = _env_job_id(), _env_attempt(), _env_run_id()
    where = f"from step {resumed_step}" if resumed_step is not None else "from the start"
    of_run = f" (run {run})" if run else ""
    logging.getLogger("ebb_sdk").info("ebb: job %s attempt %s began %s%s", job, number, where, of_run)
    wandb = sys.modules.get("wandb")
    active = getattr(wandb, "run", None) if wandb is not None else None
    if active is None:
        return
    try:
        active.summary["ebb/attempt"] = number
        active.summary["ebb/resumed_step"] = resumed_step
        active.summary["ebb/run_id"] = run
        active.config.update({"ebb_run_id": run}, allow_val_change=True)
    except Exception as e:  # a tracker's trouble must not stop training
        print(f"ebb_sdk: could not note the attempt on the wandb run: {e}", file=sys.stderr)


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


_PREFIX = r"[A-Za-z0-9_.]+"
# A step written by one process: `ckpt-000000001200.ckpt`.
_WHOLE = re.compile(rf"^(?P<prefix>{_PREFIX})-(?P<step>\d{{12}})\.ckpt$")
# One rank's part of a step: `ckpt-000000001200.rank00003-of-00016.ckpt`.
_PART = re.compile(rf"^(?P<prefix>{_PREFIX})-(?P<step>\d{{12}})\.rank(?P<rank>\d+)-of-(?P<world>\d+)\.ckpt$")
# A write in progress, or cut short: `.<final name>.tmp-<pid>`.
_TEMPORARY = re.compile(r"^\.(?P<final>.+)\.tmp-\d+$")
# Claimed by the rank that reports a gang's step: `.ckpt-000000001200.reported-<attempt>`.
_REPORTED = re.compile(rf"^\.(?P<prefix>{_PREFIX})-(?P<step>\d{{12}})\.reported-\d+$")


class _Listing(NamedTuple):
    """The directory's files of one prefix, by kind."""

    whole: Dict[int, str]  # step -> path
    parts: Dict[int, Dict[Tuple[int, int], str]]  # step -> (world, rank) -> path
    reported: List[Tuple[int, str]]  # (step, path)
    temporaries: List[Tuple[str, str]]  # (final name, path)


class CheckpointManager:
    """Checkpoints named `<prefix>-<step>.ckpt` in `directory` (default
    `$EBB_CHECKPOINT_DIR`, or `./checkpoints` outside Ebb).

    `save(step, data)` takes bytes, or a function that writes to a binary
    file object (`lambda f: torch.save(state, f)`, `lambda f: np.savez(f,
    ...)`). A file is visible under its final name only once it is complete
    and on disk, so `latest()` never returns a torn checkpoint.

    In a gang (`world_size` above 1; by default from `RANK` and
    `WORLD_SIZE`, see `ebb_sdk.rank()`), each rank saves its own part,
    `<prefix>-<step>.rank<R>-of-<N>.ckpt`, and a step counts only once all
    N parts exist; every rank then resumes from the same step, each from
    its own part. Where one rank alone saves (ranks that hold the same
    state), give that rank's manager `world_size=1`: it writes whole steps,
    which every rank's manager reads.
    """

    def __init__(
        self,
        directory: Optional[str] = None,
        keep: int = 3,
        prefix: str = "ckpt",
        interval: Optional[float] = None,
        report: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        if not re.fullmatch(_PREFIX, prefix):
            raise ValueError(f"prefix {prefix!r}: letters, digits, '_' and '.' only")
        self.world_size = _env_world_size() if world_size is None else world_size
        self.rank = _env_rank() if rank is None else rank
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank}: must be between 0 and world_size - 1 ({self.world_size - 1})")
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
        # An elastic job's change of nodes already there when this process
        # started (it resumed from the save made at it) is not a new one.
        self._members = elastic._MembersFile()
        found = self._members.read()
        self._members_at_start = self._saved_for = found.raw if found else None
        self._clean_leftovers()

    def path_for(self, step: int) -> str:
        """The file this process writes for `step`."""
        if self.world_size == 1:
            name = f"{self.prefix}-{step:012d}.ckpt"
        else:
            name = f"{self.prefix}-{step:012d}.rank{self.rank:05d}-of-{self.world_size:05d}.ckpt"
        return os.path.join(self.directory, name)

    def save(self, step: int, data: Writer) -> str:
        """Writes checkpoint `step` (this rank's part of it, in a gang)
        atomically, keeps the last K complete steps, reports the step once
        it is complete. Returns the path written."""
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
        found = self._members.read()
        self._saved_for = found.raw if found else None
        # Measured before pruning: a step older than the K newest (a job
        # that started over) is pruned as soon as it is saved.
        size = os.path.getsize(final)
        self._prune()
        if self.report:
            if self.world_size == 1:
                report_checkpoint(step, size, seconds)
            else:
                self._report_if_complete(step, seconds)
        return final

    def checkpoints(self) -> List[Checkpoint]:
        """Complete checkpoints, oldest first."""
        return [Checkpoint(step, path) for step, path in sorted(self._complete(self._list()).items())]

    def latest(self) -> Optional[Checkpoint]:
        """The newest complete checkpoint, or None on a first start."""
        found = self.checkpoints()
        return found[-1] if found else None

    def load_latest(self, read: Callable[[BinaryIO], Any]) -> Optional[tuple]:
        """`(step, read(file))` of the newest checkpoint, or None. Once
        read, the resume is reported (`resumed`)."""
        latest = self.latest()
        if latest is None:
            return None
        with open(latest.path, "rb") as f:
            state = read(f)
        self.resumed(latest.step)
        return latest.step, state

    def resumed(self, step: int) -> None:
        """Reports that this attempt resumed from `step`, once per gang
        (from rank 0), unless the manager was made with `report=False`.
        `load_latest` and `ebb_sdk.pytorch.restore` call it; call it after
        restoring from `latest()` yourself."""
        if self.report and self.rank == 0:
            report_resumed(step)
            note_attempt(step)

    def should_save(self) -> bool:
        """True when a drain was requested, an elastic job's nodes change
        and no save has followed (see `nodes_changed`), or the periodic
        interval has passed since the last save. In a gang, ranks see the
        notice at slightly different moments: agree across ranks before
        saving (say, an all-reduce of this flag) so that every rank saves
        the same step."""
        if self.watcher.drain_requested():
            return True
        found = self._members.read()
        if found is not None and found.raw != self._saved_for:
            return True
        return self.interval is not None and time.monotonic() - self._last_save >= self.interval

    def nodes_changed(self) -> bool:
        """True once this elastic job's nodes have changed since this
        process started (Ebb told this node of a shrink or a grow): every
        rank restarts to re-form, so after the save the ranks exit with a
        non-zero code and `torchrun` starts them again on the new nodes."""
        found = self._members.read()
        return found is not None and found.raw != self._members_at_start

    def drain_requested(self) -> bool:
        return self.watcher.drain_requested()

    # -- the directory ----------------------------------------------------

    def _list(self) -> _Listing:
        listing = _Listing({}, {}, [], [])
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            m = _WHOLE.match(name)
            if m and m.group("prefix") == self.prefix:
                listing.whole[int(m.group("step"))] = path
                continue
            m = _PART.match(name)
            if m and m.group("prefix") == self.prefix:
                key = (int(m.group("world")), int(m.group("rank")))
                listing.parts.setdefault(int(m.group("step")), {})[key] = path
                continue
            m = _REPORTED.match(name)
            if m and m.group("prefix") == self.prefix:
                listing.reported.append((int(m.group("step")), path))
                continue
            m = _TEMPORARY.match(name)
            if m:
                listing.temporaries.append((m.group("final"), path))
        return listing

    def _complete(self, listing: _Listing) -> Dict[int, str]:
        """Complete steps and the file this process reads each from. A
        whole step serves every rank; in a gang, a step of parts is complete
        when every rank of this world has its part there."""
        found = dict(listing.whole)
        if self.world_size > 1:
            for step, parts in listing.parts.items():
                if all((self.world_size, r) in parts for r in range(self.world_size)):
                    found[step] = parts[(self.world_size, self.rank)]
        return found

    def _owns(self, name: str) -> bool:
        """Whether `name` is a checkpoint file this process writes: whole
        steps with `world_size=1`, this rank's parts otherwise."""
        if self.world_size == 1:
            m = _WHOLE.match(name)
            return bool(m) and m.group("prefix") == self.prefix
        m = _PART.match(name)
        return bool(m) and m.group("prefix") == self.prefix and int(m.group("rank")) == self.rank

    def _report_if_complete(self, step: int, seconds: float) -> None:
        """Reports a gang's step once, when it is complete: Ebb counts each
        report as one checkpoint of the job and dates its lost work from
        it. The rank that finds the step complete after saving its part
        claims the report with a marker file created exclusively, so two
        ranks finishing together do not both report it."""
        if not in_ebb() or not os.environ.get("EBB_METADATA_URL"):
            return
        parts = self._list().parts.get(step, {})
        paths = [parts.get((self.world_size, r)) for r in range(self.world_size)]
        if None in paths:
            return  # a rank is still writing its part: that rank reports
        try:
            size = sum(os.path.getsize(p) for p in paths)
        except OSError:
            return
        attempt = os.environ.get("EBB_ATTEMPT")
        marker = os.path.join(self.directory, f".{self.prefix}-{step:012d}.reported-{attempt}")
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return  # another rank reported it
        except OSError as e:
            print(f"ebb_sdk: checkpoint report marker not written: {e}", file=sys.stderr)
        report_checkpoint(step, size, seconds)

    def _prune(self) -> None:
        """Keeps the newest K complete steps. A process deletes only files
        it writes itself, and rank 0 also the report markers and whole-step
        files of steps it no longer keeps; never a temporary, which may be
        another rank's write in progress. A rank's part of a step older than
        the newest complete one that never became complete goes too: every
        rank saves its steps in order, so no rank will add its part now."""
        listing = self._list()
        complete = sorted(self._complete(listing))
        if not complete:
            return
        kept = set(complete[-self.keep :])
        newest = complete[-1]
        gone = lambda step: step < newest and step not in kept
        doomed = []
        if self.rank == 0:
            doomed.extend(path for step, path in listing.whole.items() if gone(step))
            doomed.extend(path for step, path in listing.reported if gone(step))
        if self.world_size > 1:
            for step, parts in listing.parts.items():
                if gone(step):
                    doomed.extend(path for (_, r), path in parts.items() if r == self.rank)
        for path in doomed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _clean_leftovers(self) -> None:
        """What this process's predecessor (the same rank, in an attempt
        that ended) left unfinished: its temporaries, and in a gang its
        parts of steps newer than the newest complete one, which the other
        ranks never finished; kept, such a part could pair with their parts
        of the same step written in a later attempt."""
        listing = self._list()
        doomed = [path for final, path in listing.temporaries if self._owns(final)]
        if self.world_size > 1:
            self._warn_if_alone(listing)
            newest = max(self._complete(listing), default=-1)
            for step, parts in listing.parts.items():
                if step > newest:
                    doomed.extend(path for (_, r), path in parts.items() if r == self.rank)
        for path in doomed:
            try:
                os.unlink(path)
            except OSError:
                pass

    def _warn_if_alone(self, listing: _Listing) -> None:
        """No complete step, but parts of one rank only: most likely that
        rank alone saves, and then no step will ever be complete."""
        if self._complete(listing):
            return
        ranks = {r for parts in listing.parts.values() for (w, r) in parts if w == self.world_size}
        if len(ranks) == 1:
            print(
                f"ebb_sdk: no complete checkpoint: of {self.world_size} ranks only rank {ranks.pop()} "
                "has saved parts; in a gang every rank saves its own part, or the one rank that "
                "saves uses CheckpointManager(world_size=1)",
                file=sys.stderr,
            )
