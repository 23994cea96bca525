"""A throwaway PostgreSQL for the bench scripts: initdb and pg_ctl from
/usr/lib/postgresql/15/bin or $EBB_PG_BIN, in a directory of the bench's
own, on a unix socket only, fsync on (as a database that keeps what it
acknowledged runs); as `postgres` when run as root (initdb refuses root).
"""

import os
import pwd
import subprocess

PG_BIN = os.environ.get("EBB_PG_BIN", "/usr/lib/postgresql/15/bin")


def postgres(tmp, settings=(), warm_wal_mb=0):
    """Starts one under `tmp`; returns (connection string, stop). `settings`:
    more `-c name=value` for the server. With `warm_wal_mb`, its write-ahead
    log is first run through that many MB and kept for reuse (`min_wal_size`
    as large, then a checkpoint), as in a PostgreSQL that has been running:
    a fresh one makes each new 16 MB segment as it first needs it, writing
    it whole with zeros and syncing it while the commits that need it wait
    (`WALInitWrite`), which a bench then measures instead of the database
    an operator runs."""
    d = os.path.join(tmp, "pg")
    os.makedirs(os.path.join(d, "sock"))
    os.chmod(tmp, 0o755)  # PostgreSQL's user reaches its directory in it
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
    opts = f"-c listen_addresses='' -k {d}/sock -c max_connections=50 -c log_checkpoints=on"
    if warm_wal_mb:
        opts += f" -c min_wal_size={warm_wal_mb}MB -c max_wal_size={max(warm_wal_mb, 1024)}MB"
    for s in settings:
        opts += f" -c {s}"
    run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-o", opts, "-l", f"{d}/log", "-w", "start")
    url = f"host={d}/sock user=ebb dbname=postgres"
    if warm_wal_mb:
        # WAL records of 1 MB that touch no table, then the segments they
        # filled recycled by a checkpoint.
        psql(url, "SELECT count(pg_logical_emit_message(false, 'ebb-bench-warm', repeat('x', 1048576)))"
                  f" FROM generate_series(1, {warm_wal_mb})")
        psql(url, "CHECKPOINT")
    return url, lambda: run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "stop")


def psql(url, sql):
    """One statement's result, as text (unaligned, tuples only)."""
    out = subprocess.run([f"{PG_BIN}/psql", url, "-XAtqc", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def create_database(url, name):
    """A database of its own on the server at `url`; its connection string."""
    psql(url, f"CREATE DATABASE {name}")
    return url.replace("dbname=postgres", f"dbname={name}")
