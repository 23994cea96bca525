#!/usr/bin/env python3
"""Preemption latency and job throughput on a real `ebb up` cluster.

Prints, over many repetitions:
  * submit -> SIGTERM: from the on-demand submit returning to the victim's
    signal handler running (goal p99 <= 50 ms);
  * exit -> start: from the victim's exit to the preemptor's process start
    (goal p99 <= 100 ms);
  * throughput of short jobs (`true`) through one 8-GPU agent (goal >= 500/s).

Usage: scripts/bench-cluster.py [--reps N] [--jobs M]
Builds the release binary and runs everything on loopback in a temp dir.
"""

import argparse
import concurrent.futures
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VICTIM = r"""
import os, signal, sys, time
d = os.environ["EBB_CHECKPOINT_DIR"]
def on_term(*_):
    t = time.time()
    with open(os.path.join(d, "term"), "w") as f:
        f.write(repr(t))
    with open(os.path.join(d, "exit"), "w") as f:
        f.write(repr(time.time()))
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(d, "ready"), "w").close()
while True:
    time.sleep(1)
"""

PREEMPTOR = 'date +%s.%N > "$EBB_CHECKPOINT_DIR/start"'


class Api:
    def __init__(self, url, token):
        self.url, self.token = url, token

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def submit(self, **spec):
        return self.call("POST", "/v1/jobs", spec)["id"]

    def job(self, job_id):
        return self.call("GET", f"/v1/jobs/{job_id}")

    def metrics(self):
        req = urllib.request.Request(self.url + "/metrics")
        req.add_header("Authorization", "Bearer " + self.token)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.read().decode()


def wait(what, check, timeout=30.0, every=0.002):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    sys.exit(f"timed out waiting for {what}")


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * len(values) + 0.5)) - 1)]


def summary(name, ms, goal):
    print(f"{name:<34} n={len(ms):<5} min {min(ms):6.1f} ms   p50 {pct(ms, 50):6.1f} ms   "
          f"p99 {pct(ms, 99):6.1f} ms   max {max(ms):6.1f} ms   (goal p99 <= {goal} ms)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()

    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ebb"], cwd=ROOT, check=True)
    ebb = os.path.join(ROOT, "target", "release", "ebb")
    data = tempfile.mkdtemp(prefix="ebb-bench-")
    up = subprocess.Popen(
        [ebb, "up", "--nodes", "1", "--gpus-per-node", "8", "--port", "0", "--data-dir", data,
         "--drain-window", "30s"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while "export EBB_SERVER" not in line:
            line = up.stdout.readline()
            if not line:
                sys.exit("ebb up failed; see " + os.path.join(data, "logs"))
        url, token = re.search(r"EBB_SERVER=(\S+) EBB_TOKEN=(\S+)", line).groups()
        api = Api(url, token)
        # The admin token acts for the default tenant: its checkpoints.
        ckpt = lambda job_id: os.path.join(data, "checkpoints", "default", str(job_id))

        sent_to_term, to_term, to_start = [], [], []
        for _ in range(args.reps):
            victim = api.submit(argv=[sys.executable, "-c", VICTIM], gpus=8)
            wait("victim ready", lambda: os.path.exists(os.path.join(ckpt(victim), "ready")))
            sent = time.time()
            od = api.submit(argv=["sh", "-c", PREEMPTOR], gpus=8, tier="on-demand")
            submitted = time.time()
            term_file = os.path.join(ckpt(victim), "term")
            wait("SIGTERM", lambda: os.path.exists(term_file) and os.path.getsize(term_file) > 0)
            start_file = os.path.join(ckpt(od), "start")
            wait("preemptor start", lambda: os.path.exists(start_file) and os.path.getsize(start_file) > 0)
            with open(term_file) as f:
                term = float(f.read())
            with open(os.path.join(ckpt(victim), "exit")) as f:
                exited = float(f.read())
            with open(start_file) as f:
                started = float(f.read())
            # The notice can reach the victim before the submit's answer
            # reaches us: then this is negative, and that is the truth.
            to_term.append((term - submitted) * 1000)
            sent_to_term.append((term - sent) * 1000)
            to_start.append((started - exited) * 1000)
            wait("preemptor done", lambda: api.job(od)["state"] == "succeeded")
            # The victim was requeued; withdraw it so the next round starts clean.
            api.call("POST", f"/v1/jobs/{victim}/cancel", {})
            wait("victim cancelled", lambda: api.job(victim)["state"] == "cancelled")
        summary("on-demand submit -> victim SIGTERM", to_term, 50)
        summary("  (from sending the submit)", sent_to_term, 50)
        summary("victim exit -> preemptor start", to_start, 100)

        def succeeded():
            m = re.search(r'ebb_jobs\{tier="preemptible",state="succeeded"\} (\d+)', api.metrics())
            return int(m.group(1)) if m else 0

        before = succeeded()
        start = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda _: api.submit(argv=["true"]), range(args.jobs)))
        submitted_in = time.time() - start
        # Poll gently: a scrape walks every job in the server's writer.
        wait("all short jobs", lambda: succeeded() - before >= args.jobs, timeout=600, every=0.05)
        elapsed = time.time() - start
        drained_in = elapsed - submitted_in
        print(f"{'short jobs (true) through one 8-GPU agent':<34} {args.jobs} jobs in {elapsed:.2f} s = "
              f"{args.jobs / elapsed:.0f} jobs/s (submitted in {submitted_in:.2f} s, all done {drained_in:.2f} s later)"
              f"   (goal >= 500 jobs/s)")
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    main()
