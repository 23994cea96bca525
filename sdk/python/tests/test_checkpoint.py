import os
import signal
import subprocess
import sys
import time

import pytest

import ebb_sdk
from ebb_sdk import CheckpointManager


def test_save_latest_keep_and_report(ebb_env, endpoint):
    m = CheckpointManager(keep=2)
    assert m.directory == ebb_env["EBB_CHECKPOINT_DIR"]
    assert m.latest() is None and m.load_latest(lambda f: f.read()) is None
    m.save(10, b"ten")
    m.save(20, lambda f: f.write(b"twenty"))
    m.save(30, b"thirty")
    assert [c.step for c in m.checkpoints()] == [20, 30], "only the last 2 are kept"
    assert endpoint.resumes == [], "nothing to resume from is no resume"
    assert m.load_latest(lambda f: f.read()) == (30, b"thirty")
    assert endpoint.resumes == [{"step": 30}], "a restore is reported"
    assert [r["step"] for r in endpoint.reports] == [10, 20, 30]
    assert endpoint.reports[1]["bytes"] == len(b"twenty")
    assert all(r["seconds"] >= 0 for r in endpoint.reports)


def test_a_save_older_than_the_steps_kept_is_reported_not_raised(ebb_env, endpoint):
    """A job that started over saved step 1 next to steps 5 and 6 of its
    previous attempt: pruning took the new file before its size was read,
    and `save` raised FileNotFoundError."""
    m = CheckpointManager(keep=2)
    m.save(5, b"five")
    m.save(6, b"six")
    m.save(1, b"one")
    assert [c.step for c in m.checkpoints()] == [5, 6]
    assert endpoint.reports[-1]["step"] == 1 and endpoint.reports[-1]["bytes"] == 3


def test_a_failed_save_leaves_the_previous_checkpoint(ebb_env, endpoint):
    m = CheckpointManager()
    m.save(1, b"good")

    def broken(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        m.save(2, broken)
    assert m.load_latest(lambda f: f.read()) == (1, b"good")
    assert os.listdir(m.directory) == [os.path.basename(m.path_for(1))], "no temporary left behind"
    assert [r["step"] for r in endpoint.reports] == [1], "a failed save is not reported"


def test_a_kill_mid_write_never_yields_a_torn_checkpoint(ebb_env, tmp_path):
    m = CheckpointManager()
    m.save(1, b"x" * 1000)
    # Another process starts a big, slow save and is killed in the middle.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, ebb_sdk\n"
            "m = ebb_sdk.CheckpointManager(report=False)\n"
            "def slow(f):\n"
            "    f.write(b'y' * 4096); f.flush(); open('started', 'w').close(); time.sleep(60)\n"
            "m.save(2, slow)\n",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert any(".tmp-" in n for n in os.listdir(m.directory)), "the torn write is there, as a temporary"
    assert m.latest().step == 1
    assert m.load_latest(lambda f: f.read()) == (1, b"x" * 1000)
    # The next manager (the next attempt) clears the leftovers.
    CheckpointManager()
    assert not any(".tmp-" in n for n in os.listdir(m.directory))


def test_should_save_on_interval_or_drain(ebb_env):
    m = CheckpointManager(interval=0.1)
    assert not m.should_save()
    time.sleep(0.15)
    assert m.should_save()
    m.save(1, b"1")
    assert not m.should_save()
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while not m.drain_requested() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.should_save(), "the drain asks for a save at once"


def test_interval_defaults_to_the_recommendation(ebb_env):
    assert CheckpointManager().interval == 600.0


def test_completion_marker(ebb_env):
    assert not os.path.exists(ebb_env["EBB_COMPLETION_FILE"])
    ebb_sdk.complete()
    assert os.path.exists(ebb_env["EBB_COMPLETION_FILE"])
    # Finished work is not turned into a preemption by a late notice.
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN


def test_a_notice_during_teardown_after_complete_does_not_kill_the_job(ebb_env, tmp_path):
    # The drain signal arrives while the interpreter tears down modules,
    # after it has put the default handlers back: the exit must still be a
    # clean 0, not death by the signal.
    code = (
        "import os, signal, ebb_sdk\n"
        "class Late:\n"
        "    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGTERM):\n"
        "        kill(pid, sig)\n"
        "late = Late()\n"
        "ebb_sdk.watcher()\n"
        "ebb_sdk.complete()\n"
    )
    env = dict(os.environ, EBB_DRAIN_SIGNAL=str(int(signal.SIGTERM)), PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path)
    assert done.returncode == 0


def test_outside_ebb_it_is_a_plain_checkpoint_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = CheckpointManager()
    assert m.directory == "checkpoints" and m.interval is None
    m.save(5, b"five")
    assert m.latest().step == 5
    assert not ebb_sdk.report_checkpoint(5, 4, 0.1)
    ebb_sdk.complete()  # no marker to write: a no-op


def test_bad_arguments_are_refused(ebb_env):
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager(keep=0)
    with pytest.raises(ValueError, match="prefix"):
        CheckpointManager(prefix="a/b")
    with pytest.raises(ValueError, match="step"):
        CheckpointManager().save(-1, b"")


def test_progress_is_reported_to_the_endpoint_and_checked(ebb_env, endpoint):
    assert ebb_sdk.progress(0.62)
    assert ebb_sdk.progress(1)
    assert endpoint.progress == [{"fraction": 0.62}, {"fraction": 1.0}]
    with pytest.raises(ValueError, match="from 0 to 1"):
        ebb_sdk.progress(1.5)
    assert len(endpoint.progress) == 2


def test_progress_outside_ebb_is_a_no_op():
    assert not ebb_sdk.progress(0.5)


def test_a_resume_is_noted_in_the_log_and_on_the_wandb_run(ebb_env, endpoint, tmp_path, monkeypatch, caplog):
    """The job's one run (EBB_RUN_ID, given to wandb as its run id) shows
    which attempt began where: the real wandb client, offline."""
    import wandb

    monkeypatch.setenv("EBB_RUN_ID", "ebb-7-abc")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert ebb_sdk.run_id() == "ebb-7-abc"
    m = CheckpointManager()
    m.save(5, b"five")
    run = wandb.init(project="ebb", dir=str(tmp_path), mode="offline", id="ebb-7-abc")
    try:
        with caplog.at_level("INFO", logger="ebb_sdk"):
            assert m.load_latest(lambda f: f.read()) == (5, b"five")
        assert run.summary["ebb/attempt"] == 2
        assert run.summary["ebb/resumed_step"] == 5
        assert run.summary["ebb/run_id"] == "ebb-7-abc"
        assert run.config["ebb_run_id"] == "ebb-7-abc"
    finally:
        run.finish()
    assert "ebb: job 7 attempt 2 began from step 5 (run ebb-7-abc)" in caplog.text


def test_noting_the_attempt_outside_ebb_or_without_a_tracker_does_nothing(ebb_env, monkeypatch, caplog):
    ebb_sdk.note_attempt(3)  # in Ebb, no tracker run: the log line alone
    monkeypatch.delenv("EBB_JOB_ID")
    with caplog.at_level("INFO", logger="ebb_sdk"):
        ebb_sdk.note_attempt(3)
    assert caplog.text == ""
