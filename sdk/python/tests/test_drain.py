import json
import os
import signal
import threading
import time

import ebb_sdk
from ebb_sdk.drain import DrainWatcher

NOTICE = {
    "action": "preempt",
    "notice_at": "2026-11-29T08:17:00.000Z",
    "deadline": "2026-11-29T08:22:00.000Z",
    "reason": "preempted by job 9",
}


CANCEL = {
    "action": "cancel",
    "notice_at": "2026-11-29T08:17:00.000Z",
    "deadline": "2026-11-29T08:17:03.000Z",
    "reason": "cancel",
}


def wait_until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_outside_ebb_nothing_is_installed_and_nothing_fires(tmp_path, endpoint, monkeypatch):
    # Notices everywhere a watcher could look, but no EBB_JOB_ID: this is
    # not an Ebb attempt (say, a cloud VM with its own spot notices).
    endpoint.notice = NOTICE
    notice_file = tmp_path / "drain.json"
    notice_file.write_text(json.dumps(NOTICE))
    monkeypatch.setenv("EBB_METADATA_URL", endpoint.url)
    monkeypatch.setenv("EBB_DRAIN_FILE", str(notice_file))
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint.url + "/")
    before = signal.getsignal(signal.SIGTERM)
    w = DrainWatcher(poll_interval=0.01)
    assert not w.active
    assert signal.getsignal(signal.SIGTERM) is before
    assert not w.wait(0.3)
    assert not w.drain_requested() and w.notice() is None
    assert not ebb_sdk.drain_requested()
    assert not ebb_sdk.in_ebb()


def test_the_drain_signal_fires_and_the_notice_file_gives_the_deadline(ebb_env):
    w = DrainWatcher(poll_interval=5)
    assert w.active and not w.drain_requested()
    seen = []
    w.on_drain(seen.append)
    # The agent writes the file, then sends the job's signal.
    with open(ebb_env["EBB_DRAIN_FILE"], "w") as f:
        json.dump(NOTICE, f)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert wait_until(w.drain_requested)
    notice = w.notice()
    assert notice.reason == "preempted by job 9"
    assert notice.deadline - notice.notice_at == 300
    assert wait_until(lambda: len(seen) == 1)


def test_a_cancel_notice_is_a_notice_that_says_it_is_a_cancel(ebb_env):
    # A cancel writes its notice as a drain does, then sends SIGTERM.
    w = DrainWatcher(poll_interval=5)
    with open(ebb_env["EBB_DRAIN_FILE"], "w") as f:
        json.dump(CANCEL, f)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert wait_until(w.drain_requested)
    notice = w.notice()
    assert (notice.action, notice.reason, notice.cancelled) == ("cancel", "cancel", True)
    assert notice.deadline - notice.notice_at == 3
    assert "action='cancel'" in repr(notice)


def test_a_drain_notice_is_not_a_cancel(ebb_env):
    w = DrainWatcher(poll_interval=0.02, install_signal=False)
    with open(ebb_env["EBB_DRAIN_FILE"], "w") as f:
        json.dump(NOTICE, f)
    assert w.wait(5)
    assert not w.notice().cancelled


def test_a_signal_without_a_file_still_counts(ebb_env):
    w = DrainWatcher(poll_interval=5)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert wait_until(w.drain_requested)
    assert w.notice().source == "signal" and w.notice().deadline is None


def test_the_endpoint_is_polled_when_the_signal_is_taken_elsewhere(ebb_env, endpoint):
    w = DrainWatcher(poll_interval=0.02, install_signal=False)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert not w.wait(0.2), "no notice yet: the endpoint says 404"
    fired = threading.Event()
    w.on_drain(lambda n: fired.set())
    endpoint.notice = NOTICE
    assert w.wait(5)
    assert w.notice().source == "metadata"
    assert w.notice().time_left() < 0  # the deadline above is in the past
    assert fired.wait(5)


def test_the_notice_file_alone_is_enough(ebb_env):
    w = DrainWatcher(poll_interval=0.02, install_signal=False)
    with open(ebb_env["EBB_DRAIN_FILE"], "w") as f:
        json.dump(NOTICE, f)
    assert w.wait(5)
    assert w.notice().source == "file"


def test_a_callback_registered_after_the_drain_runs_at_once(ebb_env):
    w = DrainWatcher(poll_interval=5)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert wait_until(w.drain_requested)
    seen = []
    w.on_drain(seen.append)
    assert len(seen) == 1


def test_environment_helpers(ebb_env, monkeypatch):
    monkeypatch.setenv("EBB_TASK_INDEX", "3")
    monkeypatch.setenv("EBB_TASK_COUNT", "8")
    monkeypatch.setenv("EBB_PARAMS", '{"lr": "1e-3", "bs": "32"}')
    assert ebb_sdk.in_ebb()
    assert (ebb_sdk.job_id(), ebb_sdk.attempt()) == (7, 2)
    assert (ebb_sdk.task_index(), ebb_sdk.task_count()) == (3, 8)
    assert ebb_sdk.params() == {"lr": "1e-3", "bs": "32"}
    assert ebb_sdk.checkpoint_interval() == 600.0
