import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ebb_sdk import drain


class Endpoint:
    """A stand-in for the agent's per-attempt endpoint: serves the notice
    once set, records checkpoint and resume reports."""

    def __init__(self):
        self.notice = None
        self.members = None
        self.reports = []
        self.resumes = []
        self.progress = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                served = {"/ebb/v1/notice": endpoint.notice, "/ebb/v1/members": endpoint.members}
                if served.get(self.path) is not None:
                    body = json.dumps(served[self.path]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.end_headers()

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                if self.path == "/ebb/v1/checkpoint":
                    endpoint.reports.append(body)
                    self.send_response(202)
                elif self.path == "/ebb/v1/progress":
                    endpoint.progress.append(body)
                    self.send_response(202)
                elif self.path == "/ebb/v1/resumed":
                    endpoint.resumes.append(body)
                    self.send_response(202)
                else:
                    self.send_response(404)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No Ebb environment, and no gang's, unless a test sets one; a fresh
    default watcher; signal handlers as they were."""
    gang = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES", "LOCAL_WORLD_SIZE"}
    for key in list(os.environ):
        if key.startswith("EBB_") or key in gang:
            monkeypatch.delenv(key)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    drain._default = None
    yield
    drain._default = None
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture
def ebb_env(monkeypatch, tmp_path, endpoint):
    """The environment of an attempt, as the agent sets it."""
    run = tmp_path / "run"
    run.mkdir()
    env = {
        "EBB_JOB_ID": "7",
        "EBB_ATTEMPT": "2",
        "EBB_TIER": "preemptible",
        "EBB_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "EBB_DRAIN_FILE": str(run / "drain.json"),
        "EBB_MEMBERS_FILE": str(run / "members.json"),
        "EBB_COMPLETION_FILE": str(run / "complete"),
        "EBB_METADATA_URL": endpoint.url,
        "EBB_DRAIN_SIGNAL": str(int(signal.SIGUSR1)),
        "EBB_CHECKPOINT_INTERVAL_S": "600",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env
