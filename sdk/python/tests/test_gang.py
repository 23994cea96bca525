"""Checkpoints of a gang: every rank saves its own part into the one shared
checkpoint directory; a step is complete once every rank's part is there;
no rank deletes another's files or anything still being written."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

import ebb_sdk
from ebb_sdk import CheckpointManager

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gang_rank.py")


class Rank:
    """One rank of a two-node gang (one GPU per node, one process per GPU),
    with the environment Ebb and torchrun give it."""

    def __init__(self, rank, attempt, sync, args):
        env = dict(
            os.environ,
            EBB_ATTEMPT=str(attempt),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29500",
            WORLD_SIZE="2",
            NODE_RANK=str(rank),
            GROUP_RANK=str(rank),
            NNODES="2",
            LOCAL_WORLD_SIZE="1",
            RANK=str(rank),
            LOCAL_RANK="0",
            PYTHONPATH=os.pathsep.join(sys.path),
        )
        self.rank = rank
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, "--sync", str(sync), *args],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def expect(self, event, step=None, timeout=30.0):
        """Waits for the event (of that step); fails on an error or an exit
        before it."""
        while True:
            got = self.events.get(timeout=timeout)
            assert got is not None, f"rank {self.rank} exited ({self.proc.wait()}) before {event!r}"
            assert got["event"] != "error", f"rank {self.rank}: {got['error']}"
            if got["event"] == event and step in (None, got.get("step")):
                return got

    def drain(self):
        self.proc.send_signal(signal.SIGUSR1)


def part(step, rank, world=2):
    return f"ckpt-{step:012d}.rank{rank:05d}-of-{world:05d}.ckpt"


def preempted_attempt(attempt, ckpt_dir, sync, last):
    """Both ranks resume and save up to `last`; then rank 1, the slower,
    starts on `last + 1`, and rank 0 saves that step (and prunes) while
    rank 1's write is still in progress. The drain comes: rank 0 exits,
    rank 1 is still writing and is killed at the deadline. Returns the step
    each rank resumed from."""
    stalled = os.path.join(sync, f"stalled-{attempt}-1")
    rank0 = Rank(0, attempt, sync, ["--last", str(last + 1), "--wait-before-last", stalled])
    rank1 = Rank(1, attempt, sync, ["--last", str(last), "--stall", str(last + 1)])
    try:
        resumed = {0: rank0.expect("resumed")["step"], 1: rank1.expect("resumed")["step"]}
        rank1.expect("stalled")
        rank0.expect("saved", step=last + 1)
        in_progress = [n for n in os.listdir(ckpt_dir) if n.endswith(f".tmp-{rank1.proc.pid}")]
        assert in_progress, "rank 1's write in progress survives rank 0's save and pruning"
        rank0.drain()
        rank1.drain()
        rank0.expect("drained")
        assert rank0.proc.wait(timeout=30) == 0
    finally:
        for r in (rank0, rank1):
            if r.proc.poll() is None:
                r.proc.kill()  # the deadline
            r.proc.wait()
    return resumed


def test_a_2_node_gang_preempted_twice_keeps_both_ranks_checkpoints(ebb_env, endpoint, tmp_path):
    ckpt_dir = ebb_env["EBB_CHECKPOINT_DIR"]
    sync = tmp_path / "sync"
    sync.mkdir()
    reported = lambda: sorted(r["step"] for r in endpoint.reports)

    # Attempt 1: steps 1-5 complete, rank 0's part of step 6 alone.
    assert preempted_attempt(1, ckpt_dir, sync, last=5) == {0: 0, 1: 0}
    assert reported() == [1, 2, 3, 4, 5], "each complete step reported once; step 6 is not complete"
    names = set(os.listdir(ckpt_dir))
    for step in (4, 5):
        assert {part(step, 0), part(step, 1)} <= names, f"both ranks' parts of kept step {step}"
    assert part(6, 0) in names and part(6, 1) not in names
    assert not {part(s, 0) for s in (1, 2, 3)} & names, "rank 0 kept only the last 2 complete steps"

    # Attempt 2: both resume from step 5, the newest step every rank saved.
    assert preempted_attempt(2, ckpt_dir, sync, last=8) == {0: 5, 1: 5}
    assert reported() == [1, 2, 3, 4, 5, 6, 7, 8]
    names = set(os.listdir(ckpt_dir))
    for step in (7, 8):
        assert {part(step, 0), part(step, 1)} <= names, f"both ranks' parts of kept step {step}"
    assert part(9, 0) in names and part(9, 1) not in names

    # Attempt 3: both resume from step 8 and finish.
    ranks = [Rank(r, 3, sync, ["--last", "12", "--finish"]) for r in (0, 1)]
    try:
        assert {r.rank: r.expect("resumed")["step"] for r in ranks} == {0: 8, 1: 8}
        for r in ranks:
            r.expect("finished")
            assert r.proc.wait(timeout=30) == 0
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
    names = set(os.listdir(ckpt_dir))
    for step in (11, 12):
        assert {part(step, 0), part(step, 1)} <= names
    assert not [n for n in names if ".tmp-" in n], "each rank cleared its own cut-short write"
    assert reported() == list(range(1, 13))


def gang(directory, world=2, keep=2):
    return [CheckpointManager(directory, keep=keep, rank=r, world_size=world) for r in range(world)]


def test_a_step_is_complete_only_with_every_ranks_part(tmp_path):
    d = str(tmp_path)
    r0, r1 = gang(d)
    r0.save(1, b"0@1")
    assert r0.latest() is None and r1.latest() is None, "rank 1's part is missing"
    r1.save(1, b"1@1")
    r0.save(2, b"0@2")
    assert r0.load_latest(lambda f: f.read()) == (1, b"0@1")
    assert r1.load_latest(lambda f: f.read()) == (1, b"1@1"), "each rank reads its own part"
    r1.save(2, b"1@2")
    assert [c.step for c in r0.checkpoints()] == [1, 2]
    assert r1.latest().path == os.path.join(d, part(2, 1))


def test_pruning_keeps_other_ranks_files_and_every_temporary(tmp_path):
    d = str(tmp_path)
    r0, r1 = gang(d, keep=1)
    for step in (1, 2):
        r1.save(step, b"1")
    # Rank 1 is writing step 3; an earlier single-process save was cut short.
    theirs = os.path.join(d, "." + part(3, 1) + ".tmp-999999")
    whole = os.path.join(d, ".ckpt-000000000003.ckpt.tmp-999998")
    for path in (theirs, whole):
        open(path, "wb").close()
    for step in (1, 2, 3):
        r0.save(step, b"0")
    names = set(os.listdir(d))
    assert {part(1, 1), part(2, 1)} <= names, "rank 1 prunes its own files"
    assert part(1, 0) not in names and part(2, 0) in names, "rank 0 kept the newest complete step"
    assert os.path.exists(theirs) and os.path.exists(whole)
    # A fresh rank 0 (the next attempt) clears only what rank 0 left unfinished.
    CheckpointManager(d, rank=0, world_size=2)
    assert os.path.exists(theirs) and os.path.exists(whole)
    CheckpointManager(d, rank=1, world_size=2)
    assert not os.path.exists(theirs), "rank 1 clears its own cut-short write"
    assert os.path.exists(whole)


def test_a_rank_drops_its_parts_of_a_step_the_gang_never_completed(tmp_path):
    # Attempt 1 was cut short after rank 0 saved step 2 but before rank 1 did:
    # in attempt 2, rank 0's old part must not pair with rank 1's new one.
    d = str(tmp_path)
    r0, r1 = gang(d)
    r0.save(1, b"0@1")
    r1.save(1, b"1@1")
    r0.save(2, b"old 0@2")
    r0, r1 = gang(d)
    assert r0.latest().step == 1 and r1.latest().step == 1
    assert part(2, 0) not in os.listdir(d)
    r1.save(2, b"1@2")
    assert r1.latest().step == 1, "step 2 needs rank 0's part of this attempt"


def test_a_gang_reports_each_complete_step_once(ebb_env, endpoint):
    r0, r1 = gang(ebb_env["EBB_CHECKPOINT_DIR"])
    r0.save(1, b"a" * 10)
    assert endpoint.reports == [], "not complete yet"
    r1.save(1, b"b" * 20)
    r0.save(2, b"a")
    r1.save(2, b"b")
    r1.save(2, b"b")  # saved again in the same attempt: already reported
    assert [(r["step"], r["bytes"]) for r in endpoint.reports] == [(1, 30), (2, 2)]


def test_single_process_resumes_from_checkpoints_of_the_earlier_layout(ebb_env, endpoint):
    d = ebb_env["EBB_CHECKPOINT_DIR"]
    os.makedirs(d)
    for step in (5, 10):
        with open(os.path.join(d, f"ckpt-{step:012d}.ckpt"), "wb") as f:
            f.write(b"state %d" % step)
    m = CheckpointManager(keep=2)
    assert (m.rank, m.world_size) == (0, 1)
    assert m.load_latest(lambda f: f.read()) == (10, b"state 10")
    assert m.save(15, b"state 15") == os.path.join(d, "ckpt-000000000015.ckpt")
    assert sorted(os.listdir(d)) == ["ckpt-000000000010.ckpt", "ckpt-000000000015.ckpt"]
    assert [r["step"] for r in endpoint.reports] == [15]


def test_a_single_writer_in_a_gang_writes_whole_steps_that_every_rank_reads(tmp_path, monkeypatch):
    # Ranks that hold the same state: rank 0 alone saves, with world_size=1.
    d = str(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    writer = CheckpointManager(d, world_size=1)
    writer.save(3, b"all")
    assert os.listdir(d) == ["ckpt-000000000003.ckpt"]
    monkeypatch.setenv("RANK", "1")
    assert CheckpointManager(d).load_latest(lambda f: f.read()) == (3, b"all")
    with pytest.raises(ValueError, match="rank 1"):
        CheckpointManager(d, world_size=1)


def test_a_gang_whose_rank_0_alone_saves_parts_is_warned(tmp_path, capsys):
    d = str(tmp_path)
    r0, r1 = gang(d)
    r0.save(1, b"0")
    r0.save(2, b"0")
    assert r1.latest() is None
    CheckpointManager(d, rank=1, world_size=2)
    assert "only rank 0 has saved parts" in capsys.readouterr().err


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 1)),
        # torchrun's workers: one process per GPU.
        ({"RANK": "5", "WORLD_SIZE": "8", "NODE_RANK": "1", "NNODES": "2", "LOCAL_WORLD_SIZE": "4"}, (5, 8)),
        # A gang's command started by Ebb alone: one process per node; WORLD_SIZE counts GPUs.
        ({"WORLD_SIZE": "8", "NODE_RANK": "1", "NNODES": "2", "LOCAL_WORLD_SIZE": "4"}, (1, 2)),
    ],
)
def test_rank_and_world_size_come_from_the_gang_environment(monkeypatch, env, expected):
    for key in ("RANK", "WORLD_SIZE", "NODE_RANK", "NNODES", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert (ebb_sdk.rank(), ebb_sdk.world_size()) == expected
