#!/usr/bin/env python3
"""Failover time of a two-server control plane, and submit throughput and
latency on SQLite and on PostgreSQL.

Prints:
  * failover: `kill -9` of the leader -> the first submission answered 2xx
    by the new leader, over --kills kills with the default lease (goal
    p50 <= 3 s, max <= 10 s); the killed server comes back as a follower
    before the next kill;
  * the same for a leader frozen (SIGSTOP) until the lease runs out, over
    --freezes freezes (bounded below by the lease: 5 s by default);
  * submit throughput and p50/p99 latency, --clients clients submitting
    single jobs for --seconds seconds, on one server on SQLite and on one
    on PostgreSQL, side by side.

Usage: scripts/bench-failover.py [--kills 20] [--freezes 3] [--clients 16] [--seconds 5]
Builds the release binary; starts a throwaway PostgreSQL (initdb, pg_ctl
from /usr/lib/postgresql/15/bin or $EBB_PG_BIN; as `postgres` when run as
root) in a temp dir, on a unix socket; everything else on loopback.
"""

import argparse
import http.client
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_BIN = os.environ.get("EBB_PG_BIN", "/usr/lib/postgresql/15/bin")
JOB = json.dumps({"argv": ["true"], "gpus": 1}).encode()


def postgres(tmp):
    """A PostgreSQL of the bench's own; returns (connection string, stop)."""
    d = os.path.join(tmp, "pg")
    os.makedirs(os.path.join(d, "sock"))
    pre = None
    if os.geteuid() == 0:
        pg = pwd.getpwnam("postgres")
        for p in (d, os.path.join(d, "sock")):
            os.chown(p, pg.pw_uid, pg.pw_gid)

        def pre():
            os.setgid(pg.pw_gid)
            os.setuid(pg.pw_uid)

    def run(*args):
        subprocess.run(args, check=True, preexec_fn=pre, cwd=d, stdout=subprocess.DEVNULL)

    run(f"{PG_BIN}/initdb", "-D", f"{d}/data", "-U", "ebb", "--auth=trust", "-E", "UTF8")
    opts = f"-c listen_addresses='' -k {d}/sock -c max_connections=50"
    run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-o", opts, "-l", f"{d}/log", "-w", "start")
    url = f"host={d}/sock user=ebb dbname=postgres"
    return url, lambda: run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "stop")


class Server:
    def __init__(self, ebb, data, port, database=None, extra=()):
        self.ebb, self.data, self.port, self.database, self.extra = ebb, data, port, database, list(extra)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def start(self):
        args = [self.ebb, "server", "--data-dir", self.data, "--listen", f"127.0.0.1:{self.port}"]
        if self.database:
            args += ["--database", self.database]
        args += self.extra
        log = open(self.data + ".log", "a")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.health():
                return
            time.sleep(0.05)
        sys.exit(f"server on port {self.port} did not start; see {self.data}.log")

    def health(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            c.request("GET", "/healthz")
            return json.loads(c.getresponse().read())
        except (OSError, ValueError):
            return None

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait()


def submit(port, token, timeout=5):
    """One submission; its HTTP status (0: no answer)."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/jobs", JOB, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status
    except OSError:
        return 0


def failovers(servers, token, n, sig):
    """Fails the leader n times; each time, the seconds until the other
    server answers a submission 2xx as the leader."""
    times = []
    for i in range(n):
        leader = next(s for s in servers if (s.health() or {}).get("role") == "leader")
        other = next(s for s in servers if s is not leader)
        before = other.health()["epoch"]
        t0 = time.monotonic()
        leader.kill(sig)
        while True:
            if submit(other.port, token, timeout=1) // 100 == 2:
                h = other.health() or {}
                if h.get("role") == "leader" and h.get("epoch", 0) > before:
                    break
            time.sleep(0.01)
        times.append(time.monotonic() - t0)
        if sig == signal.SIGSTOP:
            leader.proc.send_signal(signal.SIGCONT)
            while (leader.health() or {}).get("role") != "follower":
                time.sleep(0.05)
        else:
            leader.start()
            while (leader.health() or {}).get("role") != "follower":
                time.sleep(0.05)
        print(f"  {i + 1:2}: {times[-1]:.3f} s", file=sys.stderr)
    return times


def throughput(server, token, clients, seconds):
    """Submissions/s and latency percentiles (ms), keep-alive connections."""
    latencies, errors = [], {}
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client():
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        mine = []
        while time.monotonic() < stop:
            t = time.monotonic()
            c.request("POST", "/v1/jobs", JOB, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status // 100 == 2:
                mine.append(time.monotonic() - t)
            else:
                with lock:
                    errors[r.status] = errors.get(r.status, 0) + 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    q = statistics.quantiles(latencies, n=100)
    return {
        "submits_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(q[49] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
        "errors_by_status": errors,
    }


def summary(times):
    return {
        "n": len(times),
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "min_s": round(min(times), 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--freezes", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--ebb", help="the ebb binary (default: build the release one)")
    args = ap.parse_args()
    ebb = args.ebb
    if not ebb:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ebb"], cwd=ROOT, check=True)
        ebb = os.path.join(ROOT, "target/release/ebb")
    tmp = tempfile.mkdtemp(prefix="ebb-bench-failover-")
    os.chmod(tmp, 0o755)  # PostgreSQL's user reaches its directory in it
    url, stop_pg = postgres(tmp)
    results = {}
    try:
        subprocess.run([f"{PG_BIN}/psql", url, "-qc", "CREATE DATABASE plane"], check=True)
        subprocess.run([f"{PG_BIN}/psql", url, "-qc", "CREATE DATABASE single"], check=True)
        plane = url.replace("dbname=postgres", "dbname=plane")
        servers = [Server(ebb, f"{tmp}/s{i}", 7410 + i, plane) for i in range(2)]
        for s in servers:
            s.start()
        token = open(f"{tmp}/s0/admin.token").read().strip()
        print(f"failover, kill -9, {args.kills} times:", file=sys.stderr)
        results["failover_kill"] = summary(failovers(servers, token, args.kills, signal.SIGKILL))
        print(f"failover, SIGSTOP past the lease, {args.freezes} times:", file=sys.stderr)
        results["failover_freeze"] = summary(failovers(servers, token, args.freezes, signal.SIGSTOP))
        for s in servers:
            s.kill()

        for name, database in [("sqlite", None), ("postgres", url.replace("dbname=postgres", "dbname=single"))]:
            # Room for every submission of the run: a tenant's limits are not
            # what is measured.
            roomy = ["--max-jobs-per-tenant", "10000000", "--max-stored-bytes-per-tenant", "100000000000"]
            s = Server(ebb, f"{tmp}/{name}", 7420, database, roomy)
            s.start()
            token = open(f"{tmp}/{name}/admin.token").read().strip()
            results[f"submit_{name}"] = throughput(s, token, args.clients, args.seconds)
            print(f"submit on {name}: {results[f'submit_{name}']}", file=sys.stderr)
            s.kill()
    finally:
        stop_pg()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    k, f, a, b = results["failover_kill"], results["failover_freeze"], results["submit_sqlite"], results["submit_postgres"]
    print(f"\nfailover (kill -9):  p50 {k['p50_s']} s, max {k['max_s']} s over {k['n']}   (goal p50 <= 3 s, max <= 10 s)")
    print(f"failover (frozen):   p50 {f['p50_s']} s, max {f['max_s']} s over {f['n']}   (the 5 s lease, then the takeover)")
    print(f"\n{'':12}{'submits/s':>10}{'p50 ms':>9}{'p99 ms':>9}   ({args.clients} clients, single-job requests)")
    for name, r in [("SQLite", a), ("PostgreSQL", b)]:
        print(f"{name:12}{r['submits_per_s']:>10}{r['p50_ms']:>9}{r['p99_ms']:>9}")


if __name__ == "__main__":
    main()
