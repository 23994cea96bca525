"""A Ray cluster over the job's nodes, drained with the window.

    ebb submit --gpus 8:16 --signal WINCH -- python -m ebb_sdk.ray_cluster -- python app.py

Run as the job's command on every node: the first node starts Ray's head
on the gang's port and runs the command there as Ray's driver, with
`RAY_ADDRESS` set; the other nodes join once the driver has connected
(and any node an elastic job adds later joins the running cluster). The
job ends when the driver does, with its code.

Submit it with `--signal WINCH`: the drain signal goes to every process
of the job, and Ray's take TERM as a stop; WINCH they ignore. At a drain
notice for a node (its preemption, or a shrink of an elastic job that it
leaves), Ray is told with `ray drain-node`, reason preemption, and the
seconds left to the deadline: Ray places nothing more there and its
libraries (Ray Train, Ray Data) move off. The node leaves once no task
has run on it for two seconds, or two seconds before the deadline. Tasks
that still ran there are Ray's to retry elsewhere (`max_retries`). The
driver, on the head's node, is sent TERM at its job's notice: a rigid job
preempted whole saves there and exits, and runs again.

Each node's Ray runs in a process group of its own, which this process
ends when the node leaves or the driver ends, so that the node's part of
the job ends with its Ray (a part ends when its last process does).
"""

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional, Tuple

from . import drain

_JOIN_TIMEOUT_S = 300.0
# Between a worker's Ray that gave up on the head and its next start.
_RETRY_S = 2.0
_READY = b"ebb_sdk:driver-connected"
_MARGIN_S = 2.0


def _say(text: str) -> None:
    print(f"ebb_sdk.ray_cluster: {text}", file=sys.stderr, flush=True)


def _ray() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "ray")
    return here if os.path.exists(here) else (shutil.which("ray") or "ray")


def _node() -> str:
    return os.environ.get("EBB_NODE", socket.gethostname())


def _is_first() -> bool:
    first = os.environ.get("EBB_FIRST_NODE")
    if first is not None:
        return first == _node()
    return os.environ.get("NODE_RANK", "0") == "0"


def _head() -> str:
    return f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '6379')}"


def _local_address() -> str:
    return os.environ.get("PET_LOCAL_ADDR") or os.environ.get("MASTER_ADDR") or "127.0.0.1"


def _gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([g for g in visible.split(",") if g.strip()])


def _marker() -> str:
    """The custom resource that names this node to Ray."""
    return f"ebb-node:{_node()}"


def _start(head: bool) -> subprocess.Popen:
    args = [
        _ray(), "start", "--block", "--disable-usage-stats",
        "--node-ip-address", _local_address(),
        "--num-gpus", str(_gpus()),
        "--resources", json.dumps({_marker(): 1}),
    ]
    if head:
        args += ["--head", "--port", _head().rsplit(":", 1)[1], "--include-dashboard=false"]
    else:
        args += ["--address", _head()]
    # A group of its own: this process ends it, whatever signals the job's gets.
    return subprocess.Popen(args, start_new_session=True, stdout=sys.stderr, stderr=sys.stderr)


def _stop(ray: subprocess.Popen) -> None:
    try:
        os.killpg(ray.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    ray.wait()


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _nodes() -> List[Tuple[str, dict]]:
    """The alive nodes of Ray's cluster, as its GCS has them: id and
    resources."""
    from ray._raylet import GcsClient

    info = GcsClient(address=_head()).get_all_node_info(timeout=5)
    return [(node_id.hex(), dict(node.resources_total)) for node_id, node in info.items() if node.state == 0]


def _this_node() -> Optional[str]:
    """This node's Ray id: the node with its marker resource."""
    return next((node_id for node_id, resources in _nodes() if _marker() in resources), None)


def _busy(group: int) -> bool:
    """Whether a Ray worker of this node's group runs a task: Ray titles a
    worker `ray::<task>` while it runs one and `ray::IDLE` when not."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            if int(stat[2]) != group:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if title.startswith("ray::") and not title.startswith("ray::IDLE"):
            return True
    return False


def drain_node(notice: drain.Notice) -> Optional[str]:
    """Tells Ray that this node is going: reason preemption, the seconds
    left. Returns its Ray node id, or None where Ray does not know it."""
    node_id = _this_node()
    if node_id is None:
        return None
    left = max(1, int(notice.time_left() or 1))
    done = subprocess.run(
        [
            _ray(), "drain-node", "--address", _head(), "--node-id", node_id,
            "--reason", "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message", f"Ebb: {notice.reason or notice.action} on {_node()}",
            "--deadline-remaining-seconds", str(left),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        _say(f"ray drain-node failed ({done.returncode}): {done.stderr.strip()}")
        return None
    _say(f"drained Ray node {node_id[:12]} on {_node()}, {left}s to its deadline")
    return node_id


def _leave_when_idle(ray_process: subprocess.Popen, notice: drain.Notice) -> None:
    """Ends this node's Ray once none of its workers has run a task for two
    seconds, or just before the deadline, and this process with it."""
    quiet = 0
    while True:
        left = notice.time_left()
        if left is not None and left <= _MARGIN_S:
            break
        quiet = 0 if _busy(ray_process.pid) else quiet + 1
        if quiet >= 4:
            break
        time.sleep(0.5)
    _say(f"leaving: Ray on {_node()} stops")
    _stop(ray_process)
    os._exit(0)


def _start_joined(head: bool) -> subprocess.Popen:
    """Starts this node's Ray and waits until the cluster has it. Nodes on
    one host start one at a time: Ray names a node's sockets after those
    already there, and two starting at once take the same."""
    lock = os.path.join(tempfile.gettempdir(), f"ebb-ray-start-{os.getuid()}.lock")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        ray_process = _start(head)
        deadline = time.time() + _JOIN_TIMEOUT_S
        while True:
            if ray_process.poll() is not None:
                # A worker's Ray gives up when the head's GCS is slow to
                # answer (busy with a node that just left): it starts
                # again, until the join's time is up, while the head is
                # there. The head's does not.
                _stop(ray_process)  # what its group left
                if not head and not _reachable(_head()):
                    # The head's Ray has ended: the driver is done, and the
                    # job with it (a node that grew back just then).
                    _say(f"Ray's head at {_head()} has ended: nothing to join on {_node()}")
                    os._exit(0)
                if head or time.time() + _RETRY_S > deadline:
                    raise SystemExit(f"ebb_sdk.ray_cluster: Ray exited ({ray_process.returncode}) before it joined")
                _say(f"Ray exited ({ray_process.returncode}) before it joined; starting it again in {_RETRY_S:.0f}s")
                time.sleep(_RETRY_S)
                ray_process = _start(head)
                continue
            if time.time() > deadline:
                _stop(ray_process)
                raise SystemExit(f"ebb_sdk.ray_cluster: Ray did not join in {_JOIN_TIMEOUT_S:.0f}s")
            try:
                if _reachable(_head()) and _this_node() is not None:
                    return ray_process
            except Exception:  # the GCS not answering yet
                pass
            time.sleep(0.5)


def _gcs():
    from ray._raylet import GcsClient

    return GcsClient(address=_head())


def _head_up() -> bool:
    """Whether the head's node is up and its driver has connected (or
    given up on): other nodes join only then. On one host (`ebb up`)
    every node has the same address and a driver connects to whichever
    node's Ray has it; joining after the driver keeps it on the head's
    node, which never leaves alone."""
    if not _reachable(_head()):
        return False
    try:
        return _gcs().internal_kv_get(_READY, b"ebb_sdk", timeout=5) is not None
    except Exception:  # the GCS not answering yet
        return False


def _announce_driver(driver: subprocess.Popen) -> None:
    """Lets the other nodes join once the driver has connected, or has
    not in two minutes, or has ended."""
    deadline = time.time() + _JOIN_TIMEOUT_S / 2
    while time.time() < deadline and driver.poll() is None:
        try:
            if any(not job.is_dead for job in _gcs().get_all_job_info(timeout=5).values()):
                break
        except Exception:  # the GCS busy; ask again
            pass
        time.sleep(0.25)
    _gcs().internal_kv_put(_READY, b"1", True, b"ebb_sdk", timeout=5)


def main(argv: List[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    first = _is_first()
    if first and not command:
        raise SystemExit("usage: python -m ebb_sdk.ray_cluster -- COMMAND [ARGS...] (the driver, run on the first node)")
    if os.environ.get("EBB_DRAIN_SIGNAL", "15") == str(int(signal.SIGTERM)):
        _say(
            "the job's drain signal is TERM, which stops Ray's processes at the notice rather than draining "
            "them: submit with --signal WINCH (Ray ignores it; the driver is sent TERM)"
        )
    drain.watcher()
    if not first:
        # The head's own node first: it is the cluster's GCS and first raylet.
        deadline = time.time() + _JOIN_TIMEOUT_S
        while not _head_up():
            if time.time() > deadline:
                raise SystemExit(f"ebb_sdk.ray_cluster: Ray's head at {_head()} did not come up")
            time.sleep(0.5)
    ray_process = _start_joined(head=first)
    left = threading.Event()
    driver: List[subprocess.Popen] = []

    def on_notice(notice: drain.Notice) -> None:
        # The driver hears of its job's end as a job does: TERM.
        for process in driver:
            process.send_signal(signal.SIGTERM)
        if notice.cancelled:
            if not first:
                _stop(ray_process)
                os._exit(0)
            return
        drain_node(notice)
        if not first and not left.is_set():
            left.set()
            threading.Thread(target=_leave_when_idle, args=(ray_process, notice), daemon=True).start()

    if first:
        driver.append(subprocess.Popen(command, env=dict(os.environ, RAY_ADDRESS=_head())))
        drain.on_drain(on_notice)
        _announce_driver(driver[0])
        code = driver[0].wait()
        _stop(ray_process)
        return code
    drain.on_drain(on_notice)
    # A worker stays while the head does; its Ray ends with it.
    while ray_process.poll() is None:
        if not _reachable(_head()):
            time.sleep(2)
            if not _reachable(_head()):
                break
        time.sleep(1)
    _stop(ray_process)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
