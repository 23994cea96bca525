"""Elastic jobs: the range, the change of nodes the nodes that stay are
told (the file first, the endpoint else), and the one save a change asks
for."""

import json
import os

import ebb_sdk
from ebb_sdk import CheckpointManager


def shrink(at="2026-12-06T10:00:00.000Z"):
    return {
        "change": "shrink",
        "at": at,
        "deadline": "2026-12-06T10:05:00.000Z",
        "nodes": ["node-0", "node-1"],
        "leaving": ["node-2"],
        "joining": [],
        "gpus": 16,
        "reason": "preempted by job 9",
    }


def grow(at="2026-12-06T10:20:00.000Z"):
    return {
        "change": "grow",
        "at": at,
        "nodes": ["node-0", "node-1", "node-2"],
        "leaving": [],
        "joining": ["node-2"],
        "gpus": 24,
        "reason": "grown onto node-2",
    }


def tell(env, change):
    """Writes the members file as the agent does: a new file renamed in."""
    path = env["EBB_MEMBERS_FILE"]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(change, f)
    os.replace(path + ".tmp", path)


def test_the_range_is_an_elastic_jobs_alone(ebb_env, monkeypatch):
    assert ebb_sdk.gpu_range() is None, "a rigid job has no range"
    monkeypatch.setenv("EBB_GPUS_MIN", "16")
    monkeypatch.setenv("EBB_GPUS_MAX", "48")
    assert ebb_sdk.gpu_range() == (16, 48)
    monkeypatch.delenv("EBB_JOB_ID")
    assert ebb_sdk.gpu_range() is None, "outside Ebb"


def test_a_change_is_read_from_the_file_else_the_endpoint(ebb_env, endpoint):
    assert ebb_sdk.members() is None, "no change yet"
    endpoint.members = grow()
    got = ebb_sdk.members()
    assert (got.change, got.joining, got.gpus, got.deadline) == ("grow", ["node-2"], 24, None)
    tell(ebb_env, shrink())
    got = ebb_sdk.members()
    assert (got.change, got.nodes, got.leaving, got.gpus) == ("shrink", ["node-0", "node-1"], ["node-2"], 16)
    assert got.deadline - got.at == 300
    with open(ebb_env["EBB_MEMBERS_FILE"], "w", encoding="utf-8") as f:
        f.write("{not json")
    assert ebb_sdk.members().change == "grow", "a torn file is not a change; the endpoint still answers"


def test_a_change_of_nodes_asks_for_one_save_and_the_ranks_to_re_form(ebb_env):
    m = CheckpointManager()
    assert not m.should_save() and not m.nodes_changed()
    tell(ebb_env, shrink())
    assert m.should_save() and m.nodes_changed()
    assert m.should_save(), "still, until a save follows"
    m.save(40, b"forty")
    assert not m.should_save(), "one save for the change"
    assert m.nodes_changed(), "the ranks still re-form after it"
    # The rank torchrun starts again sees the same change as already saved for.
    again = CheckpointManager()
    assert not again.should_save() and not again.nodes_changed()
    assert again.latest().step == 40
    tell(ebb_env, grow())
    assert again.should_save() and again.nodes_changed()


def test_outside_ebb_a_members_file_means_nothing(tmp_path, monkeypatch):
    path = tmp_path / "members.json"
    path.write_text(json.dumps(shrink()))
    monkeypatch.setenv("EBB_MEMBERS_FILE", str(path))
    m = CheckpointManager(directory=str(tmp_path / "ckpt"))
    assert ebb_sdk.members() is None
    assert not m.should_save() and not m.nodes_changed()
