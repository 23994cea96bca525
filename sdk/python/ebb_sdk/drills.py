"""Fire drills from a notebook: `ebb drill JOB` as a function.

    import ebb_sdk
    report = ebb_sdk.drill(42)            # EBB_SERVER, EBB_TOKEN as for the CLI
    assert report["verdict"] == "ready", report["failures"]

The server gives the running preemptible job a real drain notice with the
cluster's window, requeues it at once when it exits (neither a preemption
nor a failure, billed as run time) and watches its next attempt until it
reports resuming; this function starts the drill, follows it and returns
its report: the API's `drill` object (`verdict`, `failures`, the exit's
`margin_seconds`, `lost_seconds`, `resumed_step`, ...).

Standard library only. The server and token come as the CLI takes them:
the arguments, then `EBB_SERVER` / `EBB_TOKEN` / `EBB_CA`, then the config
file (`$EBB_CONFIG`, or `~/.config/ebb/config.json`).
"""

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional


class DrillError(Exception):
    """The drill could not be run or followed: refused by the server (the
    job is not running, not preemptible, not yours), the server cannot be
    reached, or the next attempt did not start or report its resume within
    the timeout. `report` is the drill as it stood, if it had begun."""

    def __init__(self, message: str, report: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.report = report


def _config() -> Dict[str, str]:
    path = os.environ.get("EBB_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "ebb", "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


class _Server:
    """One Ebb server's API, with a bearer token."""

    def __init__(self, server: Optional[str], token: Optional[str], ca: Optional[str]):
        config = _config()
        server = server or os.environ.get("EBB_SERVER") or config.get("server")
        token = token or os.environ.get("EBB_TOKEN") or config.get("token")
        ca = ca or os.environ.get("EBB_CA") or config.get("ca")
        if not server:
            raise DrillError('no server: pass server=, set EBB_SERVER, or put "server" in ~/.config/ebb/config.json')
        if not token:
            raise DrillError('no token: pass token=, set EBB_TOKEN, or put "token" in ~/.config/ebb/config.json')
        # Several servers of one control plane: any of them forwards to the leader.
        self.urls = [s.strip().rstrip("/") for s in server.split(",") if s.strip()]
        self.token = token
        self.context = ssl.create_default_context(cafile=ca) if ca else None

    def call(self, method: str, path: str) -> Dict[str, Any]:
        last = None
        for url in self.urls:
            req = urllib.request.Request(
                url + path,
                data=b"{}" if method == "POST" else None,
                method=method,
                headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                if e.code == 503:  # not leading, nothing was done: the next one
                    last = e
                    continue
                try:
                    message = json.loads(e.read())["error"]
                except (ValueError, KeyError, TypeError):
                    message = e.reason
                raise DrillError(f"{message} (HTTP {e.code})") from None
            except urllib.error.URLError as e:
                if method == "POST" and not isinstance(e.reason, ConnectionRefusedError):
                    raise DrillError(f"{url}: {e.reason}") from None  # it may have been sent
                last = e
        raise DrillError(f"cannot reach {', '.join(self.urls)}: {last}")


def _human(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m {int(seconds % 60):02d}s"


def drill(
    job_id: int,
    server: Optional[str] = None,
    token: Optional[str] = None,
    ca: Optional[str] = None,
    timeout: float = 300.0,
    poll: float = 0.25,
    progress: bool = True,
) -> Dict[str, Any]:
    """Runs a fire drill of job `job_id` and returns its report once it
    has a verdict (`report["verdict"]`: `ready` or `failed`, with
    `report["failures"]`). `timeout` bounds, in seconds, the wait for the
    next attempt to start once the drilled one exited, then for it to
    report resuming; past it, `DrillError` (with the report so far).
    With `progress`, each step is printed as it happens."""
    api = _Server(server, token, ca)
    job = api.call("POST", f"/v1/jobs/{int(job_id)}/drill")
    said = set()
    waiting = None  # (what, since)

    def say(key: str, text: str) -> None:
        if progress and key not in said:
            said.add(key)
            print(text, file=sys.stdout, flush=True)

    while True:
        report = job.get("drill")
        if report is None:
            raise DrillError(f"job {job_id}: the server shows no drill")
        notice = report["notice_at_ms"]
        at = lambda ms: f"+{_human((ms - notice) / 1000)}" if ms >= notice else f"-{_human((notice - ms) / 1000)}"
        attempt, deadline = report["attempt"], report["deadline"]
        say("notice", f"job {job_id}: drain notice sent to attempt {attempt}; SIGKILL at {deadline}")
        checkpoint = report.get("checkpoint")
        if checkpoint:
            step = f" (step {checkpoint['step']})" if checkpoint.get("step") is not None else ""
            say("checkpoint", f"checkpoint reported at {at(checkpoint['at_ms'])}{step}")
        if report.get("exited_ms") is not None:
            say("exit", f"{report['exit']} at {at(report['exited_ms'])}; margin {report['margin_seconds']:.1f}s")
        if report.get("next_started_ms") is not None:
            say("started", f"attempt {report['next_attempt']} started on {report['next_node']}")
        if report.get("resumed_ms") is not None:
            say("resumed", f"resumed from step {report.get('resumed_step')} at {at(report['resumed_ms'])}")
        if report.get("verdict"):
            for failure in report.get("failures", []):
                say("failure " + failure, f"  - {failure}")
            say("verdict", f"verdict: {report['verdict']}")
            return report
        if report.get("exited_ms") is None:
            what = None
        elif report.get("next_started_ms") is None:
            what = "the next attempt did not start"
        else:
            what = f"resume not confirmed within {timeout:g}s of attempt {report['next_attempt']}'s start"
        if what != (waiting[0] if waiting else None):
            waiting = (what, time.monotonic()) if what else None
        elif waiting and time.monotonic() - waiting[1] >= timeout:
            message = what if what.startswith("resume") else f"{what} within {timeout:g}s"
            raise DrillError(f"job {job_id}: {message}", report)
        time.sleep(poll)
        job = api.call("GET", f"/v1/jobs/{int(job_id)}")
