"""The Ray cluster over a job's nodes: which node is the head, where it
is, and when a leaving node's Ray workers are busy (Ray titles a worker
`ray::<task>` while it runs one, `ray::IDLE` when not)."""

import subprocess
import time

from ebb_sdk import ray_cluster


def test_the_first_node_is_the_head_elastic_or_rigid(monkeypatch):
    monkeypatch.setenv("EBB_NODE", "node-1")
    monkeypatch.setenv("EBB_FIRST_NODE", "node-0")
    assert not ray_cluster._is_first()
    monkeypatch.setenv("EBB_FIRST_NODE", "node-1")
    assert ray_cluster._is_first()
    monkeypatch.delenv("EBB_FIRST_NODE")
    monkeypatch.setenv("NODE_RANK", "2")
    assert not ray_cluster._is_first()
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert ray_cluster._head() == "10.0.0.7:29511"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert ray_cluster._gpus() == 3


def titled(title):
    """A process of a group of its own whose command line says `title`."""
    return subprocess.Popen(["bash", "-c", f"exec -a '{title}' sleep 30"], start_new_session=True)


def test_a_group_is_busy_while_a_worker_runs_a_task():
    running, idle = titled("ray::square"), titled("ray::IDLE")
    try:
        time.sleep(0.2)
        assert ray_cluster._busy(running.pid)
        assert not ray_cluster._busy(idle.pid)
    finally:
        for process in (running, idle):
            process.kill()
            process.wait()


def test_usage_is_said_without_a_command(monkeypatch, capsys):
    monkeypatch.setenv("EBB_NODE", "node-0")
    monkeypatch.setenv("EBB_FIRST_NODE", "node-0")
    try:
        ray_cluster.main([])
    except SystemExit as e:
        assert "usage: python -m ebb_sdk.ray_cluster -- COMMAND" in str(e)
    else:
        raise AssertionError("no usage")
