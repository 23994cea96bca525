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

With --fleet, instead: failover at fleet scale. Two servers on one
PostgreSQL, a simulated fleet (`ebb agent --simulate-nodes`, --nodes
nodes of 8 GPUs, following both servers) and --jobs jobs of --job-gpus
GPUs each, every GPU busy and the rest queued; then --kills times: `kill
-9` of the leader, and
  * the seconds until the other server answers a submission 2xx as the
    new leader (goal p50 <= 3 s, max <= 10 s);
  * the seconds until every node's agent has registered with it
    (`ebb_agent_registrations_total`; goal <= 15 s);
  * from the database: no attempt started twice, none ended, and every
    live job where it was (state, attempt, placement) before the kill;
  * the first fill after the takeover: --fill running jobs cancelled,
    and the jobs placed must be the --fill that waited longest (one
    tenant, one priority, one size: what the old leader would place);
then the killed server comes back as a follower before the next kill.

Usage: scripts/bench-failover.py [--kills 20] [--freezes 3] [--clients 16] [--seconds 5]
       scripts/bench-failover.py --fleet [--nodes 10000] [--jobs 100000] [--job-gpus 2]
           [--kills 5] [--fill 4]
Builds the release binary; starts a throwaway PostgreSQL (initdb, pg_ctl
from /usr/lib/postgresql/15/bin or $EBB_PG_BIN; as `postgres` when run as
root) in a temp dir, on a unix socket; everything else on loopback.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from benchpg import create_database, postgres, psql  # noqa: E402
JOB = json.dumps({"argv": ["true"], "gpus": 1}).encode()


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


class Api:
    def __init__(self, port, token):
        self.port, self.token = port, token

    def call(self, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        c.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
        r = c.getresponse()
        text = r.read()
        if r.status // 100 != 2:
            sys.exit(f"bench-failover: {method} {path}: {r.status} {text[:300]!r}")
        return json.loads(text) if text else None

    def metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


def fleet_state(db):
    """What the database says: (live jobs {id: (state, attempt, placement)},
    attempts started twice, usage records)."""
    rows = psql(db, "SELECT id, state, attempt, md5(record::json->>'placement') FROM jobs "
                    "WHERE state NOT IN ('succeeded', 'failed', 'cancelled')")
    live = {}
    for line in rows.splitlines():
        i, state, attempt, placement = line.split("|")
        live[int(i)] = (state, int(attempt), placement)
    twice = psql(db, "SELECT count(*) FROM (SELECT 1 FROM events WHERE kind = 'started' "
                     "GROUP BY job, attempt HAVING count(*) > 1) t")
    usage = psql(db, "SELECT count(*) FROM usage")
    return live, int(twice), int(usage)


def wait(what, probe, timeout, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"bench-failover: timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def fleet_failover(args, ebb, tmp, url):
    """The takeover at fleet scale; its figures."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # each node is a connection on both sides
    db = create_database(url, "fleet")
    roomy = ["--max-jobs-per-tenant", "10000000", "--max-running-jobs", "10000000",
             "--max-stored-bytes-per-tenant", "100000000000", "--max-connections-per-address", "0",
             "--heartbeat-interval", "5s", "--heartbeat-timeout", "30s", "--drain-window", "300s"]
    servers = [Server(ebb, f"{tmp}/s{i}", 7410 + i, db, roomy) for i in range(2)]
    for s in servers:
        s.start()
    token = open(f"{tmp}/s0/admin.token").read().strip()
    fleet_log = open(f"{tmp}/fleet.log", "w")
    fleet = subprocess.Popen(
        [ebb, "agent", "--server", ",".join(s.url for s in servers), "--join-token-file", f"{tmp}/s0/join.token",
         "--simulate-nodes", str(args.nodes), "--fake-gpus", "8", "--gpu-model", "H100-80GB", "--name", "sim",
         "--data-dir", f"{tmp}/fleet"], stdout=fleet_log, stderr=fleet_log)
    figures = {"nodes": args.nodes, "jobs": args.jobs, "job_gpus": args.job_gpus, "kills": []}
    try:
        leader = servers[0]
        api = Api(leader.port, token)
        wait("every node up", lambda: api.metric('ebb_nodes{status="up"}') >= args.nodes, 600, every=0.5)
        print(f"fleet: {args.nodes} nodes up", file=sys.stderr)
        job = {"argv": ["simulated"], "gpus": args.job_gpus, "env": {"EBB_SIM_DURATION": "36000"}}
        for i in range(0, args.jobs, 10_000):
            api.call("POST", "/v1/jobs/batch", {"jobs": [job] * min(10_000, args.jobs - i)})
        wait("the fleet full and started", lambda: api.metric("ebb_gpus_idle") == 0
             and api.metric('ebb_jobs{tier="preemptible",state="starting"}') == 0, 600, every=0.5)
        live, twice, usage = fleet_state(db)
        running = sum(1 for v in live.values() if v[0] == "running")
        figures["running"], figures["queued"] = running, len(live) - running
        print(f"fleet: {len(live)} jobs, {running} running", file=sys.stderr)
        for k in range(args.kills):
            leader = next(s for s in servers if (s.health() or {}).get("role") == "leader")
            other = next(s for s in servers if s is not leader)
            before_epoch = other.health()["epoch"]
            before = fleet_state(db)
            t0 = time.monotonic()
            leader.kill(signal.SIGKILL)

            def answered():
                if submit(other.port, token, timeout=2) // 100 == 2:
                    h = other.health() or {}
                    return h.get("role") == "leader" and h.get("epoch", 0) > before_epoch
                return False

            wait("the new leader's first answer", answered, 120, every=0.01)
            first_submit = time.monotonic() - t0
            new = Api(other.port, token)
            wait("every agent back", lambda: new.metric("ebb_agent_registrations_total") >= args.nodes, 120, every=0.05)
            agents_back = time.monotonic() - t0
            live, twice, usage = fleet_state(db)
            moved = [i for i, v in before[0].items() if live.get(i) != v]
            # The one job each takeover's first answer submitted, and any
            # earlier round's, wait: they are new, not moved.
            fill = fill_check(new, db, args.fill)
            leader.start()
            wait("the killed server to follow", lambda: (leader.health() or {}).get("role") == "follower", 60)
            row = {"first_submit_s": round(first_submit, 3), "agents_back_s": round(agents_back, 2),
                   "started_twice": twice, "ended": usage - before[2], "moved": len(moved), **fill}
            figures["kills"].append(row)
            print(f"  kill {k + 1}: {row}", file=sys.stderr)
    finally:
        fleet.terminate()
        try:
            fleet.wait(timeout=60)
        except subprocess.TimeoutExpired:
            fleet.kill()
        for s in servers:
            if s.proc and s.proc.poll() is None:
                s.kill()
    return figures


def fill_check(api, db, n):
    """Cancels n running jobs; the jobs placed on their GPUs must be the n
    queued ones that waited longest."""
    running = api.call("GET", f"/v1/jobs?state=running&limit={n}")["jobs"]
    waiting = [j["id"] for j in api.call("GET", f"/v1/jobs?state=queued&limit={n}")["jobs"]]
    for j in running:
        api.call("POST", f"/v1/jobs/{j['id']}/cancel", {"grace_ms": 0})

    def placed():
        states = {j: api.call("GET", f"/v1/jobs/{j}")["state"] for j in waiting}
        return all(s in ("starting", "running") for s in states.values())

    wait("the waiting jobs placed", placed, 60, every=0.05)
    # Nothing else was placed: as many jobs hold GPUs as before the cancels.
    live, _, _ = fleet_state(db)
    holding = sum(1 for v in live.values() if v[0] in ("starting", "running"))
    return {"fill_as_before": holding, "fill_placed": waiting}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--freezes", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--ebb", help="the ebb binary (default: build the release one)")
    ap.add_argument("--fleet", action="store_true", help="failover at fleet scale (above), nothing else")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--job-gpus", type=int, default=2)
    ap.add_argument("--fill", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = ap.parse_args()
    ebb = args.ebb
    if not ebb:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ebb"], cwd=ROOT, check=True)
        ebb = os.path.join(ROOT, "target/release/ebb")
    tmp = tempfile.mkdtemp(prefix="ebb-bench-failover-")
    url, stop_pg = postgres(tmp)
    results = {}
    if args.fleet:
        try:
            figures = fleet_failover(args, ebb, tmp, url)
        finally:
            stop_pg()
            if args.keep:
                print(f"bench-failover: kept {tmp}", file=sys.stderr)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        print(json.dumps(figures, indent=2))
        rows = figures["kills"]
        firsts = sorted(r["first_submit_s"] for r in rows)
        backs = sorted(r["agents_back_s"] for r in rows)
        print(f"\n{figures['nodes']:,} nodes, {figures['jobs']:,} jobs ({figures['running']:,} running), "
              f"{len(rows)} kills of the leader:")
        print(f"first submission answered by the new leader: p50 {statistics.median(firsts):.2f} s, "
              f"max {max(firsts):.2f} s   (goal p50 <= 3 s, max <= 10 s)")
        print(f"every agent back with it: p50 {statistics.median(backs):.2f} s, max {max(backs):.2f} s   (goal <= 15 s)")
        print(f"attempts started twice: {sum(r['started_twice'] for r in rows)}; ended by a takeover: "
              f"{sum(r['ended'] for r in rows)}; live jobs moved: {sum(r['moved'] for r in rows)}   (goal 0)")
        return
    try:
        plane = create_database(url, "plane")
        single = create_database(url, "single")
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

        for name, database in [("sqlite", None), ("postgres", single)]:
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
