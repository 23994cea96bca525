#!/usr/bin/env python3
"""Preemption latency and job throughput on a real `ebb up` cluster.

Prints, over many repetitions:
  * submit -> SIGTERM: from the on-demand submit returning to the victim's
    signal handler running, and from sending the submit (goal p99 <= 1.5
    ms);
  * exit -> start: from the victim's exit to the preemptor's process start
    (goal p99 <= 3 ms); the preemptor is a static program that stamps the
    time it runs;
  * throughput of short jobs (`true`) through one 8-GPU agent (goal >= 1,500/s),
    submitted one a request from 16 threads, and again a hundred a request
    (`POST /v1/jobs/batch`, as a sweep is submitted),
    and of jobs that cost nothing (a static program of one `exit` system
    call, no libc): what Ebb itself allows; with the CPU time each job
    cost the server, the agent and the job's own process, and beside
    each, the same processes started eight at a time with no scheduler
    (`posix_spawn` and `wait` from a small C program): what this machine
    allows; for the `true` jobs, where
    a GPU's time between one job and the next went (from the jobs'
    timelines: the exit's report to the next job's placement, the
    placement to its process running, and the run).

The client holds one kept-alive connection per thread. First, what the
parts of that path cost on this machine on their own (a sync, a loopback
round trip, a process start, a victim's exit to the next process's start
with no scheduler between, and a request's notice to a victim's SIGTERM
handler with no scheduler between), for the figures' context.

With --webhook-hangs, the same with a webhook for every job event of the
tenant whose receiver accepts connections and never answers: each event
is a row of the outbox the writer commits, and none is ever taken (past
10,000 waiting, a line in the webhook's log instead); compare the figures
with a run without it.

With --image, instead: the time from a submit returning to the job's
process running, for a bare process and for the same command in an image
the node has cached (a real docker-registry on loopback, a busybox image
built with umoci and pushed with skopeo), and with --pull-mb N the time
to pull and unpack an image of N MB of incompressible data.

With --nodes-dir DIR, the nodes' directories (each job's working, run
and checkpoint directories) are made on DIR's file system, linked from
the cluster's data directory, and the server's database stays where it
was: to tell the file system's cost of a job's directories from Ebb's.
On ext4 without a journal (this machine's), making a directory passes
over every inode of its block group freed in the last five minutes
whose table block is unwritten: after earlier runs' removals, most of
the agent's CPU.

Usage: scripts/bench-cluster.py [--reps N] [--jobs M] [--ebb PATH] [--webhook-hangs] [--nodes-dir DIR]
       scripts/bench-cluster.py --image [--reps N] [--pull-mb 1024]
Builds the release binary and runs everything on loopback in a temp dir.
"""

import argparse
import concurrent.futures
import http.client
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
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



class OneWrite(http.client.HTTPConnection):
    """Sends a request's head and body in one write, as a tuned client
    does (http.client sends them in two, and the server's read of the
    body waits for the second)."""

    def _send_output(self, message_body=None, encode_chunked=False):
        self._buffer.extend((b"", b""))
        msg = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(msg + (message_body or b""))


class Api:
    """The API over one kept-alive connection per thread, as a client
    library holds one: the figures are the server's, not TCP handshakes'."""

    def __init__(self, url, token):
        self.url, self.token = url, token
        self.host = urllib.parse.urlsplit(url).netloc
        self.local = threading.local()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": "Bearer " + self.token}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for retry in (True, False):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = OneWrite(self.host, timeout=60)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                break
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self.local.conn = None
                if not retry:
                    raise
        if resp.status >= 400:
            sys.exit(f"{method} {path}: {resp.status} {payload.decode(errors='replace')}")
        return json.loads(payload)

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
    """The nearest-rank percentile: the smallest value with at least p% of
    the values at or below it (the 99th of 100 for p99, not the largest)."""
    values = sorted(values)
    return values[max(0, math.ceil(p * len(values) / 100) - 1)]


def summary(name, ms, goal):
    print(f"{name:<34} n={len(ms):<5} min {min(ms):6.2f} ms   p50 {pct(ms, 50):6.2f} ms   "
          f"p99 {pct(ms, 99):6.2f} ms   max {max(ms):6.2f} ms   (goal p99 <= {goal} ms)")


def slot_time(api, ids):
    """Where a GPU's time went between one short job and the next, from
    the jobs' timelines (millisecond stamps: the server's when it placed
    the job, the agent's when the process started and exited), over the
    jobs that were waiting when their GPU's job before them exited."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        jobs = list(pool.map(api.job, ids))
    by_gpu = {}
    for j in jobs:
        at = {e["kind"]: e for e in j["events"]}
        gpu = at["placed"]["detail"]["placement"][0]["gpus"][0]
        run = j["usage"][-1]  # the attempt of the last placement
        by_gpu.setdefault(gpu, []).append(
            (at["placed"]["at_ms"], at["submitted"]["at_ms"], run["started_ms"], run["ended_ms"]))
    to_start, running, to_next = [], [], []
    for runs in by_gpu.values():
        runs.sort()
        for (_, _, _, ended), (placed, submitted, started, _) in zip(runs, runs[1:]):
            if submitted <= ended:  # it was waiting when the GPU came free
                to_next.append(placed - ended)
                to_start.append(started - placed)
        running += [ended - started for _, _, started, ended in runs]
    if not to_start:
        print(f"{'':<34} a GPU's time between jobs: no job waited for its GPU (too few jobs)")
        return
    mean = lambda xs: sum(xs) / len(xs)
    print(f"{'':<34} a GPU's time between jobs, mean of {len(to_start)}: exit -> the next job placed "
          f"{mean(to_next):.1f} ms, placed -> its process started {mean(to_start):.1f} ms (p90 "
          f"{pct(to_start, 90)}), started -> exited {mean(running):.1f} ms")


def start_up(ebb, data, *flags):
    """`ebb up` with one 8-GPU agent in `data`: the process and its API."""
    up = subprocess.Popen(
        [ebb, "up", "--nodes", "1", "--gpus-per-node", "8", "--port", "0", "--data-dir", data, *flags],
        stdout=subprocess.PIPE, text=True)
    line = ""
    while "export EBB_SERVER" not in line:
        line = up.stdout.readline()
        if not line:
            sys.exit("ebb up failed; see " + os.path.join(data, "logs"))
    url, token = re.search(r"EBB_SERVER=(\S+) EBB_TOKEN=(\S+)", line).groups()
    return up, Api(url, token)


def stop_up(up):
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=30)
    except subprocess.TimeoutExpired:
        up.kill()


def hanging_receiver():
    """A receiver that takes connections and never answers: its port."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept():
        while True:
            conn, _ = listener.accept()
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registry(data):
    """A docker-registry on a free loopback port: (host, process)."""
    host = f"127.0.0.1:{free_port()}"
    config = os.path.join(data, "registry.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n"
                f"  filesystem:\n    rootdirectory: {data}/registry\nhttp:\n  addr: {host}\n")
    proc = subprocess.Popen(["docker-registry", "serve", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait("the registry", lambda: socket.socket().connect_ex(tuple([host.split(":")[0], int(host.split(":")[1])])) == 0)
    return host, proc


NOW_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* Writes the time its process started running to FILE, or else to
   $EBB_CHECKPOINT_DIR/start. */
int main(int argc, char **argv) {
    struct timespec t;
    char path[4096];
    clock_gettime(CLOCK_REALTIME, &t);
    if (argc > 1)
        snprintf(path, sizeof path, "%s", argv[1]);
    else
        snprintf(path, sizeof path, "%s/start", getenv("EBB_CHECKPOINT_DIR"));
    FILE *f = fopen(path, "w");
    fprintf(f, "%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec);
    return fclose(f) != 0;
}
"""


# A job that costs nothing: no libc (whose start-up probes the CPU's
# caches with `cpuid`, which a virtual machine may trap), one system call.
NOTHING_C = r"""
void _start(void) { __asm__ volatile("mov $60, %eax\n xor %edi, %edi\n syscall"); }
"""


# The notice's path with no scheduler on it: a "server" process that takes
# a request over loopback TCP, makes one 4 KiB write durable (the commit's
# sync), passes the victim's pid over loopback TCP to an "agent" process,
# which sends SIGTERM, and answers. Every scheduler's notice crosses these.
RELAY_C = r"""
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
static int listener(int *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (void *)&a, n) || listen(s, 1) || getsockname(s, (void *)&a, &n)) exit(1);
    *port = ntohs(a.sin_port);
    return s;
}
static int nodelay(int s) { int one = 1; setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); return s; }
/* Usage: relay FILE. Prints the port the client connects to; then, for
   each line (a pid) the client sends: FILE's 4 KiB written and synced, the
   pid passed to the agent, which signals it, and the line answered. */
int main(int argc, char **argv) {
    int port, agent_port, agent_listener = listener(&agent_port);
    if (fork() == 0) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(agent_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int s = nodelay(socket(AF_INET, SOCK_STREAM, 0));
        char buf[64];
        ssize_t n;
        if (connect(s, (void *)&a, sizeof a)) exit(1);
        while ((n = read(s, buf, sizeof buf - 1)) > 0) {
            buf[n] = 0;
            kill(atoi(buf), SIGTERM);
        }
        exit(0);
    }
    int agent = nodelay(accept(agent_listener, 0, 0));
    int client_listener = listener(&port);
    printf("%d\n", port);
    fflush(stdout);
    int client = nodelay(accept(client_listener, 0, 0));
    int fd = open(argv[1], O_WRONLY | O_CREAT, 0600);
    char page[4096], buf[64];
    memset(page, 7, sizeof page);
    ssize_t n;
    for (int i = 0; (n = read(client, buf, sizeof buf)) > 0; i++) {
        if (pwrite(fd, page, sizeof page, (i % 16) * 4096) != sizeof page || fsync(fd)) exit(1);
        if (write(agent, buf, n) != n || write(client, buf, n) != n) exit(1);
    }
    return 0;
}
"""


def build_nothing(data):
    src, exe = os.path.join(data, "nothing.c"), os.path.join(data, "nothing")
    with open(src, "w") as f:
        f.write(NOTHING_C)
    subprocess.run(["gcc", "-static", "-nostdlib", "-O2", "-o", exe, src], check=True)
    return exe


def cpu_ms(up):
    """CPU time so far (ms) of `ebb up`'s server and agent, and of the
    processes the agent has reaped (its jobs'), from /proc."""
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == up.pid and len(argv) > 1 and argv[1] in (b"server", b"agent"):
            utime, stime, cutime, cstime = (int(x) * tick for x in fields[11:15])
            found[argv[1].decode()] = (utime + stime, cutime + cstime)
    return {"server": found["server"][0], "agent": found["agent"][0], "jobs": found["agent"][1]}


def build_now(data):
    """A static program that writes the time (ns) to a file: the same one
    runs bare and in the image, so both starts are timed alike."""
    src, exe = os.path.join(data, "now.c"), os.path.join(data, "now")
    with open(src, "w") as f:
        f.write(NOW_C)
    subprocess.run(["gcc", "-static", "-O2", "-o", exe, src], check=True)
    return exe


def push_image(data, host, name, extra_mb=0, now=None):
    """A busybox image (plus EXTRA_MB of random bytes) pushed as NAME:v1."""
    layout, bundle = os.path.join(data, f"oci-{name}"), os.path.join(data, f"bundle-{name}")
    run = lambda *a: subprocess.run(a, check=True, stdout=subprocess.DEVNULL)
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:v1")
    run("umoci", "unpack", "--image", f"{layout}:v1", bundle)
    root = os.path.join(bundle, "rootfs")
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    for applet in ["sh", "true", "cat"]:
        os.symlink("busybox", os.path.join(root, "bin", applet))
    if now:
        shutil.copy(now, os.path.join(root, "bin", "now"))
    if extra_mb:
        with open(os.path.join(root, "data"), "wb") as f:
            for _ in range(extra_mb):
                f.write(os.urandom(1 << 20))
    run("umoci", "repack", "--image", f"{layout}:v1", bundle)
    run("umoci", "config", "--image", f"{layout}:v1", "--config.env", "PATH=/bin")
    run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{host}/{name}:v1")
    shutil.rmtree(bundle)
    return f"{host}/{name}:v1"


def floors(data, now, n=200):
    """What this machine's parts of the path cost on their own, measured
    beside the figures: a 4 KiB write and fsync in the data directory (a
    commit's sync), a loopback TCP round trip between two Python threads,
    a process start (posix_spawn of the static stamp program until its
    main runs, and until it is reaped), the handover with nothing
    between (a Python process stamps and exits, and a waiter, on its
    pidfd, then posix_spawn, starts the stamp program at once), and the
    notice with nothing between (`notice_floor`)."""
    import threading
    path = os.path.join(data, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    syncs = []
    for i in range(n):
        t = time.perf_counter()
        os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
        os.fsync(fd)
        syncs.append((time.perf_counter() - t) * 1000)
    os.close(fd)
    os.unlink(path)

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def echo():
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (b := conn.recv(64)):
            conn.sendall(b)

    threading.Thread(target=echo, daemon=True).start()
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    trips = []
    for _ in range(n):
        t = time.perf_counter()
        client.sendall(b"x")
        client.recv(64)
        trips.append((time.perf_counter() - t) * 1000)
    client.close()

    stamp = os.path.join(data, "spawn-probe")
    starts, reaped = [], []
    for _ in range(n):
        t = time.time()
        pid = os.posix_spawn(now, [now, stamp], {})
        os.waitpid(pid, 0)
        reaped.append((time.time() - t) * 1000)
        with open(stamp) as f:
            starts.append((float(f.read()) - t) * 1000)
    handover = []
    victim = "import os, sys, time\nf = open(sys.argv[1], 'w'); sys.stdin.read(1)\n" \
             "f.write(repr(time.time())); f.close(); os._exit(0)"
    exited = os.path.join(data, "exit-probe")
    for _ in range(n // 2):
        v = subprocess.Popen([sys.executable, "-c", victim, exited], stdin=subprocess.PIPE)
        time.sleep(0.02)  # its start-up done, as a running victim's is
        fd = os.pidfd_open(v.pid)
        v.stdin.write(b"x")
        v.stdin.flush()
        select.select([fd], [], [])
        v.wait()
        os.close(fd)
        pid = os.posix_spawn(now, [now, stamp], {})
        os.waitpid(pid, 0)
        with open(exited) as f, open(stamp) as g:
            handover.append((float(g.read()) - float(f.read())) * 1000)
    notice = notice_floor(data, n // 2)
    print("this machine's floors, measured now:")
    print(f"  {'4 KiB write + fsync':<32} p50 {pct(syncs, 50):6.3f} ms   p99 {pct(syncs, 99):6.3f} ms")
    print(f"  {'loopback round trip (Python)':<32} p50 {pct(trips, 50):6.3f} ms   p99 {pct(trips, 99):6.3f} ms")
    print(f"  {'posix_spawn -> main (static)':<32} p50 {pct(starts, 50):6.3f} ms   p99 {pct(starts, 99):6.3f} ms")
    print(f"  {'posix_spawn -> reaped (static)':<32} p50 {pct(reaped, 50):6.3f} ms   p99 {pct(reaped, 99):6.3f} ms"
          f"   (one after another: {1000 / statistics.mean(reaped):.0f} processes/s)")
    print(f"  {'exit -> next start, no scheduler':<32} p50 {pct(handover, 50):6.3f} ms   p99 {pct(handover, 99):6.3f} ms"
          "   (a Python process's exit, reaped by pidfd, the stamp program spawned)")
    print(f"  {'submit -> SIGTERM, no scheduler':<32} p50 {pct(notice, 50):6.3f} ms   p99 {pct(notice, 99):6.3f} ms"
          "   (loopback to a server, a 4 KiB write synced, loopback to an agent, its kill, the victim's handler)")


# Starts a program n times, `at_once` at a time, as `posix_spawn` does (a
# `clone(CLONE_VM | CLONE_VFORK)`, as the agent's own starts), reaping each
# with `wait`: the least a starter can cost. Prints the rate, the CPU each
# process took (its start included) and the starter's own.
SPAWN_C = r"""
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static double cpu(int who) {
    struct rusage r;
    getrusage(who, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]), at_once = atoi(argv[2]), started = 0, running = 0, done = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    while (done < n) {
        while (running < at_once && started < n) {
            pid_t pid;
            if (posix_spawnp(&pid, argv[3], NULL, NULL, argv + 3, environ) != 0) { perror(argv[3]); return 1; }
            started++, running++;
        }
        int status;
        if (wait(&status) > 0) running--, done++;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%f %f %f\n", n / s, cpu(RUSAGE_CHILDREN) * 1e3 / n, cpu(RUSAGE_SELF) * 1e3 / n);
    return 0;
}
"""


def processes_floor(data, argv, n):
    """The same processes with no scheduler: started n times, eight at a
    time, on this machine's cores, as the agent's eight GPUs would, by
    SPAWN_C. Returns processes per second, the CPU each process cost and
    the starter's CPU for each (ms)."""
    src, exe = os.path.join(data, "spawn.c"), os.path.join(data, "spawn")
    if not os.path.exists(exe):
        with open(src, "w") as f:
            f.write(SPAWN_C)
        subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    out = subprocess.run([exe, str(n), "8", *argv], capture_output=True, text=True, check=True).stdout
    rate, process, starter = map(float, out.split())
    return rate, process, starter


def notice_floor(data, n):
    """The notice's path with nothing of a scheduler's on it (RELAY_C):
    from sending the request to the victim's SIGTERM handler running, the
    victim the same Python program as the bench's, its start-up done."""
    src, exe = os.path.join(data, "relay.c"), os.path.join(data, "relay")
    with open(src, "w") as f:
        f.write(RELAY_C)
    subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    relay = subprocess.Popen([exe, os.path.join(data, "relay-probe")], stdout=subprocess.PIPE, text=True)
    client = socket.create_connection(("127.0.0.1", int(relay.stdout.readline())))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    victim = VICTIM.replace('os.environ["EBB_CHECKPOINT_DIR"]', "sys.argv[1]")
    ms = []
    try:
        for i in range(n):
            d = os.path.join(data, f"notice-probe-{i}")
            os.mkdir(d)
            v = subprocess.Popen([sys.executable, "-c", victim, d])
            # Sent the moment its start-up is seen done, as the bench's.
            wait("the probe's victim", lambda: os.path.exists(os.path.join(d, "ready")))
            sent = time.time()
            client.sendall(f"{v.pid}\n".encode())
            client.recv(64)
            v.wait()
            with open(os.path.join(d, "term")) as f:
                ms.append((float(f.read()) - sent) * 1000)
            shutil.rmtree(d)
    finally:
        client.close()
        relay.wait()
    return ms


def image_bench(ebb, args):
    data = tempfile.mkdtemp(prefix="ebb-bench-image-")
    host, reg = registry(data)
    now = build_now(data)
    small = push_image(data, host, "small", now=now)
    big = push_image(data, host, "big", args.pull_mb) if args.pull_mb else None
    up, api = start_up(ebb, data, "--insecure-registry", host)
    try:
        ckpt = lambda job_id: os.path.join(data, "checkpoints", "default", str(job_id))
        stamp = lambda program: ["sh", "-c", program + ' "$EBB_CHECKPOINT_DIR/start"']
        # The first start pulls: not counted.
        first = api.submit(argv=stamp("/bin/now"), image=small)
        wait("the first image job", lambda: api.job(first)["state"] == "succeeded", timeout=120)
        for label, argv, extra in [("bare process", stamp(now), {}), ("cached image", stamp("/bin/now"), {"image": small})]:
            ms = []
            for _ in range(args.reps):
                job = api.submit(argv=argv, **extra)
                submitted = time.time()
                start = os.path.join(ckpt(job), "start")
                wait("the job's start", lambda: os.path.exists(start) and os.path.getsize(start) > 0)
                with open(start) as f:
                    ms.append((float(f.read()) - submitted) * 1000)
                wait("the job's end", lambda: api.job(job)["state"] == "succeeded")
            summary(f"submit -> start, {label}", ms, 100 if extra else 50)
        if big:
            job = api.submit(argv=["true"], image=big)
            wait("the big image's job", lambda: api.job(job)["state"] in ("succeeded", "failed"), timeout=1800)
            shown = api.job(job)
            pulled = [e for e in shown["events"] if e["kind"] == "pulled"][0]["detail"]
            pulling = [e for e in shown["events"] if e["kind"] == "pulling"][0]["detail"]
            mb = pulled["downloaded_bytes"] / 1e6
            print(f"pull of a {args.pull_mb} MiB image: {mb:.0f} MB downloaded (of {pulling['total_bytes'] / 1e6:.0f} MB "
                  f"of layers) and unpacked in {pulled['seconds']:.2f} s = {mb / pulled['seconds']:.0f} MB/s; "
                  f"the job {shown['state']}")
    finally:
        stop_up(up)
        reg.kill()
        shutil.rmtree(data, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--image", action="store_true", help="start times in an image against a bare process")
    parser.add_argument("--pull-mb", type=int, default=0, help="with --image: pull an image this big")
    parser.add_argument("--ebb", help="this ebb binary instead of building the release one (to compare builds)")
    parser.add_argument("--webhook-hangs", action="store_true",
                        help="with a webhook on every job event whose receiver never answers")
    parser.add_argument("--nodes-dir", help="the nodes' directories (jobs' working, run and checkpoint "
                        "directories) on this directory's file system; the database stays in the temp dir")
    args = parser.parse_args()
    for flag in ("reps", "jobs"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}: at least 1, got {getattr(args, flag)}")
    if args.nodes_dir and not os.path.isdir(args.nodes_dir):
        sys.exit(f"--nodes-dir {args.nodes_dir}: not a directory")
    if args.ebb:
        ebb = os.path.abspath(args.ebb)
    else:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ebb"], cwd=ROOT, check=True)
        ebb = os.path.join(ROOT, "target", "release", "ebb")
    if args.image:
        return image_bench(ebb, args)

    data = tempfile.mkdtemp(prefix="ebb-bench-")
    nodes = None
    if args.nodes_dir:
        nodes = tempfile.mkdtemp(prefix="ebb-bench-nodes-", dir=args.nodes_dir)
        for sub in ["agents", "checkpoints"]:
            os.mkdir(os.path.join(nodes, sub))
            os.symlink(os.path.join(nodes, sub), os.path.join(data, sub))
        print(f"the nodes' directories on {args.nodes_dir} ({nodes}); the database in {data}")
    # The preemptor is a static program that stamps when it runs: what is
    # timed is Ebb starting a process, not a shell's or `date`'s start-up.
    now = build_now(data)
    floors(data, now)
    up, api = start_up(ebb, data, "--drain-window", "30s")
    try:
        if args.webhook_hangs:
            port = hanging_receiver()
            events = ["preempted", "requeued", "promoted", "failed", "succeeded", "cancelled", "drill"]
            hook = api.call("POST", "/v1/webhooks",
                            {"tenant": "default", "url": f"http://127.0.0.1:{port}/", "events": events})
            print(f"webhook {hook['id']} on every job event, to a receiver that never answers")
        # The admin token acts for the default tenant: its checkpoints.
        ckpt = lambda job_id: os.path.join(data, "checkpoints", "default", str(job_id))

        sent_to_term, to_term, to_start = [], [], []
        for _ in range(args.reps):
            victim = api.submit(argv=[sys.executable, "-c", VICTIM], gpus=8)
            wait("victim ready", lambda: os.path.exists(os.path.join(ckpt(victim), "ready")))
            sent = time.time()
            od = api.submit(argv=[now], gpus=8, tier="on-demand")
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
        summary("on-demand submit -> victim SIGTERM", to_term, 1.5)
        summary("  (from sending the submit)", sent_to_term, 1.5)
        summary("victim exit -> preemptor start", to_start, 3)

        def succeeded():
            m = re.search(r'ebb_jobs\{tier="preemptible",state="succeeded"\} (\d+)', api.metrics())
            return int(m.group(1)) if m else 0

        def short_jobs(what, argv, batch=1):
            before, cpu_before = succeeded(), cpu_ms(up)
            me_before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.time()
            if batch == 1:
                with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
                    ids = list(pool.map(lambda _: api.submit(argv=argv), range(args.jobs)))
            else:
                sizes = [min(batch, args.jobs - i) for i in range(0, args.jobs, batch)]
                with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                    list(pool.map(lambda n: api.call("POST", "/v1/jobs/batch", {"jobs": [{"argv": argv}] * n}),
                                  sizes))
            submitted_in = time.time() - start
            # Poll gently: a scrape walks every job in the server's writer.
            wait("all short jobs", lambda: succeeded() - before >= args.jobs, timeout=600, every=0.05)
            elapsed = time.time() - start
            drained_in = elapsed - submitted_in
            cpu = {k: (v - cpu_before[k]) / args.jobs for k, v in cpu_ms(up).items()}
            me = resource.getrusage(resource.RUSAGE_SELF)
            client = (me.ru_utime + me.ru_stime - me_before.ru_utime - me_before.ru_stime) * 1000 / args.jobs
            print(f"{what:<34} {args.jobs} jobs in {elapsed:.2f} s = {args.jobs / elapsed:.0f} jobs/s "
                  f"(submitted in {submitted_in:.2f} s, all done {drained_in:.2f} s later)   (goal >= 1,500 jobs/s)")
            print(f"{'':<34} CPU per job: server {cpu['server']:.2f} ms, agent {cpu['agent']:.2f} ms, "
                  f"the job's process {cpu['jobs']:.2f} ms; this client (submits, polls) {client:.2f} ms")
            if batch == 1 and argv == ["true"]:
                slot_time(api, ids)
            if batch == 1:
                rate, process, starter = processes_floor(data, argv, args.jobs)
                print(f"{'':<34} no scheduler: {rate:.0f} processes/s, 8 at a time (posix_spawn, wait); "
                      f"CPU per process {process:.2f} ms, the starter's {starter:.3f} ms")

        short_jobs("short jobs (true) through one 8-GPU agent", ["true"])
        # The same jobs submitted as a sweep's are, a hundred to a request:
        # the agent's and the scheduler's share without the submissions'.
        short_jobs("  the same, submitted 100 a request", ["true"], batch=100)
        short_jobs("jobs that do nothing, the same way", [build_nothing(data)])
        if args.webhook_hangs:
            hook = api.call("GET", "/v1/webhooks")[0]
            print(f"webhook {hook['id']}: {hook['pending']} deliveries waiting for the receiver")
    finally:
        stop_up(up)
    # Only after a run that finished: a failed one's logs stay to be read.
    shutil.rmtree(data, ignore_errors=True)
    if nodes:
        shutil.rmtree(nodes, ignore_errors=True)


if __name__ == "__main__":
    main()
