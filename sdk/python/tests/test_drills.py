"""`ebb_sdk.drill` against a stand-in for the server's API: what it sends,
how it follows the drill, what it returns and how it fails. The drill
itself, on a real cluster, is exercised from crates/cli/tests/e2e/drill.rs."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import ebb_sdk

NOTICE = 1_000_000


def drill_at(stage):
    """The `drill` object as the server shows it at each stage."""
    d = {
        "attempt": 1,
        "nodes": ["node-0"],
        "notice_at": "t",
        "notice_at_ms": NOTICE,
        "deadline": "2026-11-30T10:00:10Z",
        "deadline_ms": NOTICE + 10_000,
        "window_seconds": 10.0,
        "requeued": False,
    }
    if stage >= 1:
        d.update(
            checkpoint={"at": "t", "at_ms": NOTICE + 300, "attempt": 1, "step": 7, "after_notice_seconds": 0.3},
            exited_ms=NOTICE + 400,
            exit="exited with code 0",
            fit_window=True,
            margin_seconds=9.6,
            lost_seconds=0.1,
            requeued=True,
        )
    if stage >= 2:
        d.update(next_attempt=2, next_node="node-0", next_started_ms=NOTICE + 900)
    if stage >= 3:
        d.update(resumed_ms=NOTICE + 1200, resumed_step=7, verdict="ready", failures=[])
    return d


class Api:
    """Answers the drill's POST, then each GET with the next stage; or
    refuses the POST with `refuse` (status, message)."""

    def __init__(self, stages, refuse=None):
        self.requests = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                api.requests.append(("POST", self.path, self.headers.get("Authorization")))
                if refuse:
                    return self.answer(refuse[0], {"error": refuse[1]})
                self.answer(200, {"id": 7, "state": "draining", "drill": drill_at(stages[0])})

            def do_GET(self):
                api.requests.append(("GET", self.path, self.headers.get("Authorization")))
                n = sum(1 for r in api.requests if r[0] == "GET")
                stage = stages[min(n, len(stages) - 1)]
                self.answer(200, {"id": 7, "state": "running", "drill": drill_at(stage)})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def api_for():
    made = []

    def make(stages, refuse=None):
        made.append(Api(stages, refuse))
        return made[-1]

    yield make
    for api in made:
        api.close()


def test_a_drill_is_started_followed_and_its_report_returned(api_for, monkeypatch, capsys):
    api = api_for([0, 0, 1, 2, 2, 3])
    monkeypatch.setenv("EBB_SERVER", api.url)
    monkeypatch.setenv("EBB_TOKEN", "secret")
    monkeypatch.setenv("EBB_CONFIG", "/nonexistent")
    report = ebb_sdk.drill(7, poll=0.01)
    assert report["verdict"] == "ready" and report["resumed_step"] == 7
    assert api.requests[0] == ("POST", "/v1/jobs/7/drill", "Bearer secret")
    assert {r[1] for r in api.requests[1:]} == {"/v1/jobs/7"}
    out = capsys.readouterr().out
    for step in ["drain notice sent to attempt 1", "checkpoint reported at +0.3s (step 7)", "exited with code 0",
                 "attempt 2 started on node-0", "resumed from step 7 at +1.2s", "verdict: ready"]:
        assert step in out, out
    assert out.count("checkpoint reported") == 1, "each step said once"


def test_the_server_and_token_may_come_from_the_arguments_or_the_config_file(api_for, monkeypatch, tmp_path):
    api = api_for([3])
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"server": "http://127.0.0.1:1", "token": "from-file"}))
    monkeypatch.setenv("EBB_CONFIG", str(config))
    assert ebb_sdk.drill(7, server=api.url, progress=False)["verdict"] == "ready"
    assert api.requests[0][2] == "Bearer from-file"


def test_a_refused_drill_raises_with_the_servers_words(api_for, monkeypatch):
    api = api_for([0], refuse=(409, "job 7: queued; only a running job can be drilled"))
    monkeypatch.setenv("EBB_CONFIG", "/nonexistent")
    with pytest.raises(ebb_sdk.DrillError) as refused:
        ebb_sdk.drill(7, server=api.url, token="t", progress=False)
    assert str(refused.value) == "job 7: queued; only a running job can be drilled (HTTP 409)"
    assert refused.value.report is None


def test_a_resume_not_reported_in_time_raises_with_the_report_so_far(api_for, monkeypatch):
    api = api_for([0, 1, 2])
    monkeypatch.setenv("EBB_CONFIG", "/nonexistent")
    with pytest.raises(ebb_sdk.DrillError) as late:
        ebb_sdk.drill(7, server=api.url, token="t", timeout=0.2, poll=0.01, progress=False)
    assert "resume not confirmed within 0.2s of attempt 2's start" in str(late.value)
    assert late.value.report["next_attempt"] == 2 and "verdict" not in late.value.report


def test_without_a_server_it_says_how_to_give_one(monkeypatch):
    monkeypatch.setenv("EBB_CONFIG", "/nonexistent")
    with pytest.raises(ebb_sdk.DrillError, match="no server"):
        ebb_sdk.drill(7)
