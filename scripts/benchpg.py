"""A throwaway PostgreSQL for the bench scripts: initdb and pg_ctl from
/usr/lib/postgresql/15/bin or $EBB_PG_BIN, in a directory of the bench's
own, on a unix socket only, fsync on (as a database that keeps what it
acknowledged runs); as `postgres` when run as root (initdb refuses root).
"""

import os
import pwd
import subprocess

PG_BIN = os.environ.get("EBB_PG_BIN", "/usr/lib/postgresql/15/bin")


def postgres(tmp, settings=()):
    """Starts one under `tmp`; returns (connection string, stop). `settings`:
    more `-c name=value` for the server."""
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
    opts = f"-c listen_addresses='' -k {d}/sock -c max_connections=50"
    for s in settings:
        opts += f" -c {s}"
    run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-o", opts, "-l", f"{d}/log", "-w", "start")
    url = f"host={d}/sock user=ebb dbname=postgres"
    return url, lambda: run(f"{PG_BIN}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "stop")


def psql(url, sql):
    """One statement's result, as text (unaligned, tuples only)."""
    out = subprocess.run([f"{PG_BIN}/psql", url, "-XAtqc", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def create_database(url, name):
    """A database of its own on the server at `url`; its connection string."""
    psql(url, f"CREATE DATABASE {name}")
    return url.replace("dbname=postgres", f"dbname={name}")
