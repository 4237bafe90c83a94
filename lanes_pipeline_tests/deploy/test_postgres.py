"""Postgres instance storage: dagster.postgres.yaml stays dagster.yaml plus its storage, the local server of
lanes_pipeline/deploy/postgres.py starts, answers, restarts and stops without leaving a process, and a missing
variable or an unreachable server is named before Dagster opens the instance (also through `lanes backfill`).
The daily backfill through the daemon on this storage is test_daily_backfill.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg2
import pytest
import yaml
from dagster import DagsterInstance
from dagster_postgres import PostgresRunStorage

from lanes_pipeline.config.models import ConfigError
from lanes_pipeline.deploy import postgres
from lanes_pipeline.deploy.instance_storage import check_instance_storage, postgres_targets
from lanes_pipeline.settings import project_root

YAML = project_root() / postgres.POSTGRES_YAML
PG_VARS = tuple(postgres.ENV_OF_KEY.values())


@pytest.fixture(scope="module")
def server() -> Iterator[postgres.PostgresServer]:
    with postgres.temporary_server() as running:
        yield running


def _without_pg(environ: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environ.items() if name not in PG_VARS}


def _postmasters(cluster: Path) -> list[psutil.Process]:
    """Running postgres processes whose command line names the cluster folder."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(cluster) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def test_postgres_yaml_is_dagster_yaml_plus_storage_from_the_variables() -> None:
    variant = yaml.safe_load(YAML.read_text())
    plain = yaml.safe_load((project_root() / "dagster.yaml").read_text())
    storage = variant.pop("storage")
    assert variant == plain, "dagster.postgres.yaml must keep every other setting of dagster.yaml"
    db = storage["postgres"]["postgres_db"]
    assert {key: db[key] for key in postgres.ENV_OF_KEY} == {
        key: {"env": name} for key, name in postgres.ENV_OF_KEY.items()
    }
    assert db["scheme"] == "postgresql+psycopg2"  # the driver installed (SQLAlchemy 2.1 would pick psycopg 3)


def test_unset_variables_are_each_named_with_file_and_key() -> None:
    config = yaml.safe_load(YAML.read_text())
    environ = {"LANES_PG_HOST": "127.0.0.1", "LANES_PG_USER": "lanes", "LANES_PG_DB": "dagster"}
    with pytest.raises(ConfigError) as error:
        postgres_targets(config, "dagster.postgres.yaml", environ)
    assert [str(issue).split(": ")[1] for issue in error.value.issues] == [
        "storage.postgres.postgres_db.port",
        "storage.postgres.postgres_db.password",
    ]
    assert "reads $LANES_PG_PORT, which is not set" in str(error.value)
    assert "reads $LANES_PG_PASSWORD, which is not set" in str(error.value)
    bad_port = environ | {"LANES_PG_PORT": "five", "LANES_PG_PASSWORD": "x"}
    with pytest.raises(ConfigError, match=r"postgres_db.port: 'five' \(\$LANES_PG_PORT\) is not a port"):
        postgres_targets(config, "dagster.postgres.yaml", bad_port)
    # The SQLite instance (dagster.yaml) asks for no Postgres at all.
    plain = yaml.safe_load((project_root() / "dagster.yaml").read_text())
    assert postgres_targets(plain, "dagster.yaml", {}) == []


def test_a_folder_the_server_user_cannot_pass_is_named() -> None:
    # Not under pytest's tmp folder: that is 0700 itself (and is named so when root starts a server there).
    with tempfile.TemporaryDirectory(prefix="lanes-pg-") as tmp:
        Path(tmp).chmod(0o755)
        _named_blocking_folder(Path(tmp) / "closed")


def _named_blocking_folder(closed: Path) -> None:
    closed.mkdir(mode=0o700)
    (closed / "pg").mkdir()
    nobody = postgres.OsUser("nobody", uid=65534, gid=65534)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert postgres.blocking_folder(closed / "pg", nobody) == closed
    closed.chmod(0o711)
    assert postgres.blocking_folder(closed / "pg", nobody) != closed


def test_server_answers_and_the_instance_stores_in_it(server: postgres.PostgresServer) -> None:
    env = server.env()
    assert (server.folder / "env").read_text().count("export ") == len(env)
    assert stat.S_IMODE((server.folder / "server.json").stat().st_mode) == 0o600
    assert (server.dagster_home / "dagster.yaml").resolve() == YAML.resolve()
    check_instance_storage(server.dagster_home, env)  # answers: no error
    previous = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with DagsterInstance.get() as instance:
            assert isinstance(instance.run_storage, PostgresRunStorage)
            instance.event_log_storage.set_concurrency_slots("cpu_lane", 3)
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    # The pool limit is a row of the server's database, not of a SQLite file.
    connection = psycopg2.connect(
        host=server.host, port=server.port, user=server.user, password=server.password, dbname=server.db_name
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute("""SELECT "limit" FROM concurrency_limits WHERE concurrency_key = 'cpu_lane'""")
            assert cursor.fetchone() == (3,)
    finally:
        connection.close()
    # Starting a running server again changes nothing.
    pid = postgres.postmaster_pid(server.folder)
    assert postgres.start(server.folder) == server
    assert postgres.postmaster_pid(server.folder) == pid


def test_stopped_server_is_named_with_host_and_variables_then_restarts_on_its_port(
    server: postgres.PostgresServer,
) -> None:
    pid = postgres.postmaster_pid(server.folder)
    assert pid is not None and psutil.pid_exists(pid)
    assert postgres.stop(server.folder) is True
    try:
        assert not psutil.pid_exists(pid) and _postmasters(server.cluster) == []
        assert postgres.stop(server.folder) is False  # stopping a stopped server is no error
        with pytest.raises(ConfigError) as error:
            check_instance_storage(server.dagster_home, server.env())
        message = str(error.value)
        assert f"Postgres at 127.0.0.1:{server.port}" in message and "is unreachable" in message
        assert "hostname from $LANES_PG_HOST, port from $LANES_PG_PORT" in message
        assert str(YAML.resolve()) in message and "storage.postgres" in message

        # Through a command, as a user meets it: one line naming it, no Dagster traceback.
        command = [sys.executable, "-m", "lanes_pipeline.cli", "backfill", "--from", "2026-11-01"]
        command += ["--to", "2026-11-01"]
        base = _without_pg(dict(os.environ)) | {"DAGSTER_HOME": str(server.dagster_home)}
        for environ, expected in (
            (base | server.env(), f"Postgres at 127.0.0.1:{server.port}"),
            (base, "reads $LANES_PG_HOST, which is not set"),
        ):
            done = subprocess.run(
                command, env=environ, cwd=project_root(), capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 1, done.stdout + done.stderr
            assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    finally:
        restarted = postgres.start(server.folder)
    assert restarted == server  # the same port and password: the env file still holds
    check_instance_storage(server.dagster_home, server.env())


def test_temporary_server_leaves_no_process_and_no_folder() -> None:
    with postgres.temporary_server() as running:
        folder, pid = running.folder, postgres.postmaster_pid(running.folder)
        assert pid is not None and psutil.pid_exists(pid)
        if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as the unprivileged user
            assert psutil.Process(pid).username() == postgres.SERVER_OS_USER
    assert not psutil.pid_exists(pid) and _postmasters(folder) == [] and not folder.exists()
