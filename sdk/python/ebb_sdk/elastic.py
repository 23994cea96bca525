"""Elastic jobs (`ebb submit --gpus MIN:MAX`): the range, the nodes, and the
changes of nodes Ebb tells the nodes that stay.

When Ebb shrinks an elastic job, the leaving nodes get the drain notice and
the nodes that stay get a change of nodes (`EBB_MEMBERS_FILE`, `GET
/ebb/v1/members`) before the leaving nodes' deadline; when it grows the
job, the nodes it ran on get one as the new nodes start. Either way every
rank restarts (torchrun re-forms the group), so the job saves once, while
every rank is still there: `CheckpointManager.should_save()` is True once
a change has come that no save followed, and `nodes_changed()` says the
ranks should exit for torchrun to re-form them.

    import ebb_sdk
    lo, hi = ebb_sdk.gpu_range() or (world, world)
    change = ebb_sdk.members()          # None until the first change
    if change: print(change.change, change.nodes, change.gpus)
"""

import json
import os
import urllib.error
import urllib.request
from typing import List, Optional, Tuple

from ._env import in_ebb
from .drain import _epoch


def gpu_range() -> Optional[Tuple[int, int]]:
    """An elastic job's fewest and most GPUs (`EBB_GPUS_MIN`,
    `EBB_GPUS_MAX`); None for any other job, and outside Ebb."""
    low, high = os.environ.get("EBB_GPUS_MIN"), os.environ.get("EBB_GPUS_MAX")
    if not (in_ebb() and low and high):
        return None
    return int(low), int(high)


class Members:
    """A change of an elastic job's nodes: `change` is "shrink" or "grow";
    `nodes` are the job's nodes once it is done, its first node first;
    `leaving` and `joining` the nodes that go and come; `gpus` what it
    holds then; `at` when Ebb decided it and, for a shrink, `deadline` when
    the leaving nodes are killed (seconds since the epoch)."""

    def __init__(self, raw: dict):
        self.raw = raw
        self.change: str = raw.get("change", "")
        self.nodes: List[str] = list(raw.get("nodes", []))
        self.leaving: List[str] = list(raw.get("leaving", []))
        self.joining: List[str] = list(raw.get("joining", []))
        self.gpus: int = int(raw.get("gpus", 0))
        self.reason: str = raw.get("reason", "")
        self.at = _epoch(raw.get("at"))
        self.deadline = _epoch(raw.get("deadline"))

    def __eq__(self, other) -> bool:
        return isinstance(other, Members) and self.raw == other.raw

    def __repr__(self) -> str:
        return f"Members(change={self.change!r}, nodes={self.nodes!r}, gpus={self.gpus}, at={self.raw.get('at')!r})"


def members() -> Optional[Members]:
    """The latest change of this attempt's nodes, or None: none yet, not
    an elastic job, or outside Ebb. Read from the members file, else the
    attempt's endpoint."""
    if not in_ebb():
        return None
    return _MembersFile().read() or _from_endpoint()


def _from_endpoint() -> Optional[Members]:
    url = os.environ.get("EBB_METADATA_URL")
    if not url:
        return None
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ebb/v1/members", timeout=2) as resp:
            return Members(json.loads(resp.read().decode("utf-8")))
    except urllib.error.HTTPError:
        return None  # 404: no change yet
    except (OSError, ValueError):
        return None


class _MembersFile:
    """The members file, read again only when it was replaced: a stat a
    call, cheap enough to ask at every step."""

    def __init__(self):
        self.path = os.environ.get("EBB_MEMBERS_FILE") if in_ebb() else None
        self._seen: Optional[tuple] = None
        self._members: Optional[Members] = None

    def read(self) -> Optional[Members]:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                with open(self.path, "r", encoding="utf-8") as f:
                    self._members = Members(json.load(f))
                self._seen = key
            except (OSError, ValueError):
                return self._members
        return self._members
