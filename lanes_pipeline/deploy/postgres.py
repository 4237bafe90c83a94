"""A local PostgreSQL for the Dagster instance (dagster.postgres.yaml) with no system service, and the check
that the instance's Postgres answers before Dagster tries it.

`python -m lanes_pipeline.deploy.postgres start [--dir D] [--port P]` (`make postgres`): Debian's server
binaries (`initdb`, `pg_ctl`) make a cluster in D/cluster the first time (D defaults to <data>/postgres),
with a superuser `lanes` whose password is generated then, start it on 127.0.0.1 (port P, or a free one) with
its unix socket inside the cluster folder, create the `dagster` database, and write D/server.json (the
connection, mode 0600), D/env (the same as `export` lines, plus DAGSTER_HOME=D/dagster_home, whose
dagster.yaml links to dagster.postgres.yaml) and print the variables. Starting a running server again changes
nothing. `stop` (`make postgres-stop`) stops it: a fast shutdown, open transactions are rolled back.

PostgreSQL refuses to run as root. As root, initdb and pg_ctl run as an unprivileged user (`nobody`, through
`setpriv`), who owns D/cluster; every folder above it must let that user pass (the project's data folder and
/tmp do; a 0700 home or pytest's tmp folder does not, and the error names the folder).
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict

from lanes_pipeline.settings import data_dir, project_root

# The variables dagster.postgres.yaml reads, by the postgres_db key they fill.
ENV_OF_KEY = {
    "hostname": "LANES_PG_HOST",
    "port": "LANES_PG_PORT",
    "username": "LANES_PG_USER",
    "password": "LANES_PG_PASSWORD",
    "db_name": "LANES_PG_DB",
}
SUPERUSER, DATABASE, HOST = "lanes", "dagster", "127.0.0.1"
SERVER_OS_USER = "nobody"  # who runs PostgreSQL when we are root
POSTGRES_YAML = "dagster.postgres.yaml"
START_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 10  # from postmaster.pid's removal to the process' exit
CONNECT_TIMEOUT_S = 5
# A unix socket's path is at most 107 bytes (sun_path); the socket is <cluster>/.s.PGSQL.<port>.
MAX_SOCKET_PATH = 107


class PostgresError(RuntimeError):
    """The local server could not be made, started or stopped; the message says why and where."""


class PostgresServer(BaseModel):
    """A local server made here: where it lives and how to connect (saved as D/server.json)."""

    model_config = ConfigDict(extra="forbid")

    folder: Path
    port: int
    password: str
    host: str = HOST
    user: str = SUPERUSER
    db_name: str = DATABASE

    @property
    def cluster(self) -> Path:
        return cluster_dir(self.folder)

    @property
    def dagster_home(self) -> Path:
        return self.folder / "dagster_home"

    def env(self) -> dict[str, str]:
        """The variables that point dagster.postgres.yaml and `make run|dev` at this server."""
        values = {
            "hostname": self.host,
            "port": str(self.port),
            "username": self.user,
            "password": self.password,
            "db_name": self.db_name,
        }
        return {ENV_OF_KEY[key]: value for key, value in values.items()} | {
            "DAGSTER_HOME": str(self.dagster_home)
        }


def cluster_dir(folder: Path) -> Path:
    return folder / "cluster"


def env_file_text(server: PostgresServer) -> str:
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in server.env().items())
    header = (
        f"# The local PostgreSQL of {server.folder} (lanes_pipeline/deploy/postgres.py): source this file."
    )
    return f"{header}\n{exports}"


def _version_of_bin(path: Path) -> tuple[int, ...]:
    """/usr/lib/postgresql/<version>/bin/<tool> -> the version as numbers (9.6 -> (9, 6), 15 -> (15,))."""
    return tuple(int(part) for part in path.parts[-3].split(".") if part.isdigit())


def postgres_bin(name: str) -> str:
    """A PostgreSQL server binary: on PATH, else Debian's newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=_version_of_bin)
    if not candidates:
        raise PostgresError(
            f"PostgreSQL's `{name}` is neither on PATH nor in /usr/lib/postgresql/*/bin: install the server "
            "(Debian: apt-get install postgresql) or put its bin folder on PATH"
        )
    return str(candidates[-1])


@dataclass(frozen=True)
class OsUser:
    name: str
    uid: int
    gid: int


def server_os_user(name: str = SERVER_OS_USER) -> OsUser | None:
    """Who runs initdb and pg_ctl: we ourselves (None), or, as root, the unprivileged `name`."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise PostgresError(f"PostgreSQL refuses root, and there is no user {name!r} to run it as") from None
    return OsUser(name, entry.pw_uid, entry.pw_gid)


def _as_user(argv: list[str], user: OsUser | None) -> list[str]:
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--", *argv]


def blocking_folder(path: Path, user: OsUser) -> Path | None:
    """The first folder from / down to `path` that `user` may not pass through (search permission)."""
    for folder in [*reversed(path.parents), path]:
        info = folder.stat()
        if info.st_uid == user.uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == user.gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def free_port(preferred: int | None = None) -> int:
    """`preferred` if free (a restarted server keeps the port its env file names), else any free port."""
    for port in (preferred, 0):
        if port is None:
            continue
        with socket.socket() as probe, suppress(OSError):
            # As PostgreSQL binds: the stopped server's own connections in TIME_WAIT do not hold the port.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((HOST, port))
            return int(probe.getsockname()[1])
    raise PostgresError(f"no free port on {HOST}")


def _run(argv: list[str], user: OsUser | None, what: str, cwd: Path, log: Path | None = None) -> None:
    """Run a PostgreSQL tool; a failure says what failed, its output and the server log's end."""
    done = subprocess.run(
        _as_user(argv, user),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S + 60,
        check=False,
    )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
        raise PostgresError(
            f"{what} failed (exit {done.returncode}): {(done.stdout + done.stderr).strip()[-2000:]}"
            + (f"\nserver log {log}:\n{tail}" if tail else "")
        )


def is_running(folder: Path, os_user: str = SERVER_OS_USER) -> bool:
    cluster = cluster_dir(folder.absolute())
    if not (cluster / "PG_VERSION").exists():
        return False
    argv = [postgres_bin("pg_ctl"), "status", "-D", str(cluster)]
    done = subprocess.run(_as_user(argv, server_os_user(os_user)), cwd=cluster.parent, capture_output=True)
    return done.returncode == 0  # 3: not running


def postmaster_pid(folder: Path) -> int | None:
    """The pid of the folder's running postmaster (from its postmaster.pid), if any."""
    pid_file = cluster_dir(folder.absolute()) / "postmaster.pid"
    return int(pid_file.read_text().split()[0]) if pid_file.exists() else None


def _init_cluster(cluster: Path, password: str, user: OsUser | None, sync: bool) -> None:
    cluster.mkdir(mode=0o700)
    pwfile = cluster.parent / ".initdb-password"
    pwfile.touch(mode=0o600)
    try:
        pwfile.write_text(password + "\n")
        if user is not None:
            for path in (cluster, pwfile):
                os.chown(path, user.uid, user.gid)
        argv = [postgres_bin("initdb"), "-D", str(cluster), "-U", SUPERUSER, f"--pwfile={pwfile}"]
        argv += ["--auth=scram-sha-256", "--no-locale", "--encoding=UTF8", "--no-instructions"]
        argv += [] if sync else ["--no-sync"]  # a scratch cluster need not survive a power cut
        _run(argv, user, f"initdb of {cluster}", cwd=cluster.parent)
    except BaseException:
        shutil.rmtree(cluster, ignore_errors=True)  # a retry starts from an empty folder
        raise
    finally:
        pwfile.unlink(missing_ok=True)


def _saved(folder: Path) -> PostgresServer | None:
    path = folder / "server.json"
    return PostgresServer.model_validate_json(path.read_text()) if path.exists() else None


def _write_files(server: PostgresServer) -> None:
    for name, text in (("server.json", server.model_dump_json(indent=2)), ("env", env_file_text(server))):
        path = server.folder / name
        path.touch(mode=0o600)
        path.write_text(text + "\n")
    server.dagster_home.mkdir(exist_ok=True)
    link = server.dagster_home / "dagster.yaml"
    if not link.exists() and not link.is_symlink():
        link.symlink_to(project_root() / POSTGRES_YAML)


def create_database(server: PostgresServer) -> None:
    """Create the server's database unless it exists."""
    import psycopg2
    from psycopg2 import sql

    kwargs = {"host": server.host, "port": server.port, "user": server.user, "password": server.password}
    connection = psycopg2.connect(dbname="postgres", connect_timeout=CONNECT_TIMEOUT_S, **kwargs)
    try:
        connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (server.db_name,))
            if cursor.fetchone() is None:
                cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(server.db_name)))
    finally:
        connection.close()


def start(
    folder: Path | None = None, port: int | None = None, os_user: str = SERVER_OS_USER, sync: bool = True
) -> PostgresServer:
    """Make (the first time) and start the local server of `folder`; return how to reach it. `sync=False`
    skips initdb's flush to disk (scratch clusters: tests)."""
    folder = (folder or data_dir() / "postgres").absolute()
    folder.mkdir(parents=True, exist_ok=True)
    cluster, user = cluster_dir(folder), server_os_user(os_user)
    if user is not None and (blocked := blocking_folder(folder, user)):
        raise PostgresError(
            f"{blocked} does not let user {user.name!r} through (PostgreSQL refuses root and runs as "
            f"{user.name!r}): choose a --dir every user can reach, or `chmod o+x {blocked}`"
        )
    if len(str(cluster)) + len("/.s.PGSQL.65535") > MAX_SOCKET_PATH:
        raise PostgresError(
            f"{cluster} is too long a path for PostgreSQL's unix socket: choose a shorter --dir"
        )
    saved = _saved(folder)
    if saved is not None and is_running(folder, os_user):
        if port is not None and port != saved.port:
            raise PostgresError(f"{cluster} already runs on port {saved.port}: stop it first to move it")
        create_database(saved)
        _write_files(saved)
        return saved
    if not (cluster / "PG_VERSION").exists():
        shutil.rmtree(cluster, ignore_errors=True)  # what a failed initdb left
        password = secrets.token_urlsafe(24)
        _init_cluster(cluster, password, user, sync)
    elif saved is None:
        raise PostgresError(
            f"{cluster} exists but {folder / 'server.json'} (its password) is gone: "
            f"remove {cluster} to start afresh"
        )
    else:
        password = saved.password
    server = PostgresServer(folder=folder, port=port or free_port(saved and saved.port), password=password)
    log = cluster / "postgres.log"
    options = f"-c listen_addresses={HOST} -p {server.port} -k {shlex.quote(str(cluster))}"
    argv = [postgres_bin("pg_ctl"), "start", "-D", str(cluster), "-l", str(log), "-w"]
    argv += ["-t", str(START_TIMEOUT_S), "-o", options]
    _run(argv, user, f"starting PostgreSQL of {cluster} on {HOST}:{server.port}", cwd=folder, log=log)
    _write_files(server)  # before the database: a failure below still leaves the password on disk
    create_database(server)
    return server


def stop(folder: Path | None = None, os_user: str = SERVER_OS_USER) -> bool:
    """Stop the local server of `folder`; False when it was not running."""
    folder = (folder or data_dir() / "postgres").absolute()
    if not is_running(folder, os_user):
        return False
    pid = postmaster_pid(folder)
    argv = [postgres_bin("pg_ctl"), "stop", "-D", str(cluster_dir(folder)), "-m", "fast", "-w"]
    argv += ["-t", str(START_TIMEOUT_S)]
    _run(argv, server_os_user(os_user), f"stopping PostgreSQL of {cluster_dir(folder)}", cwd=folder)
    # pg_ctl returns once postmaster.pid is gone, which the postmaster removes just before it exits.
    if pid is not None:
        with suppress(psutil.NoSuchProcess):
            try:
                psutil.Process(pid).wait(timeout=EXIT_TIMEOUT_S)
            except psutil.TimeoutExpired:
                raise PostgresError(
                    f"PostgreSQL of {folder} (pid {pid}) still runs after pg_ctl stop"
                ) from None
    return True


@contextmanager
def temporary_server(os_user: str = SERVER_OS_USER) -> Iterator[PostgresServer]:
    """A server in a fresh folder under the system's temporary folder, stopped and removed on leaving (tests).
    The folder is made passable by everyone: as root, PostgreSQL runs as `os_user`."""
    folder = Path(tempfile.mkdtemp(prefix="lanes-pg-"))
    try:
        folder.chmod(0o755)
        server = start(folder, os_user=os_user, sync=False)
        try:
            yield server
        finally:
            stop(folder, os_user)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lanes_pipeline.deploy.postgres", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument(
        "--dir", type=Path, default=None, help="the server's folder (default: <data>/postgres)"
    )
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--os-user", default=SERVER_OS_USER, help="who runs PostgreSQL when we are root")
    args = parser.parse_args(argv)
    folder = (args.dir or data_dir() / "postgres").absolute()
    try:
        if args.action == "stop":
            print(f"PostgreSQL of {folder}: {'stopped' if stop(folder, args.os_user) else 'was not running'}")
            return 0
        server = start(folder, args.port, args.os_user)
    except PostgresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"PostgreSQL runs on {server.host}:{server.port} "
        f"(cluster {server.cluster}, log {server.cluster / 'postgres.log'})"
    )
    print(f"The instance on it: `source {folder / 'env'}`, then `make run` or `make dev`. These variables:")
    print(env_file_text(server).split("\n", 1)[1], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
