"""The suite's tiers cannot drift: lane marks come from the fixtures a test uses, a hand-written one is
refused, a test that starts a lane's server without saying so fails, and a registry-downloading fixture puts
its tests in the slow tier; under pytest-xdist the server tests share one worker. Each case runs the
project's conftest hooks in a scratch pytest session."""

from __future__ import annotations

import pytest

from lanes_pipeline_tests.server_worker import default_workers, server_tests_first

pytest_plugins = ["pytester"]

# The project's hooks and fixtures, with the engine fixtures replaced: these sessions start no server.
CONFTEST = """
from pathlib import Path

import pytest

from lanes_pipeline_tests.conftest import (
    _servers_started_are_declared,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)


@pytest.fixture(scope="session")
def cpu_engine() -> Path:
    return Path("/bin/true")


@pytest.fixture(scope="session")
def real_package_repo() -> Path:
    return Path(".")
"""
INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider
markers =
    cpu_lane: lane
    gpu_lane: lane
    slow: tier
"""
# An "engine" that exits at once (a program in the engines folder): start() gets past the guard only to fail
# with the server's own error.
START_A_CPU_SERVER = """
import pytest

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer, ServerCommand
from lanes_pipeline.errors import EmbeddedStartError


def start(tmp_path, program="engine"):
    command = ServerCommand("cpu", [str(engines.engines_dir() / program)], {}, 9, "/health")
    with pytest.raises(EmbeddedStartError, match="exited with code 0"):
        EmbeddedServer(command, tmp_path, ready_timeout_s=5, publish=False).start()
"""


@pytest.fixture
def session(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    return pytester


def test_a_test_is_marked_with_the_lane_its_fixtures_start(session: pytest.Pytester) -> None:
    session.makepyfile(
        test_tiers="""
        def test_pure():
            pass

        def test_own_server(cpu_engine):
            pass

        def test_downloads(real_package_repo):
            pass
        """
    )
    lane = session.runpytest("--collect-only", "-q", "-m", "cpu_lane")
    lane.stdout.fnmatch_lines(["test_tiers.py::test_own_server", "*1/3 tests collected (2 deselected)*"])
    fast = session.runpytest("--collect-only", "-q", "-m", "not slow")
    fast.stdout.fnmatch_lines(["*2/3 tests collected (1 deselected)*"])
    assert "test_downloads" not in fast.stdout.str()


# Each test writes which xdist worker ran it and when it started; each takes a moment, as a real one does.
RECORDING_TEST = """
import os
import time
from pathlib import Path


def _record(name):
    Path({ran!r}, name).write_text(os.environ["PYTEST_XDIST_WORKER"] + " " + repr(time.monotonic()))
    time.sleep(0.3)


def test_server_{n}(cpu_engine):
    _record("server_{n}")


def test_pure_{n}():
    _record("pure_{n}")


def test_pure_{n}_again():
    _record("pure_{n}_again")
"""


def _run_recording(session: pytest.Pytester, order: str) -> dict[str, tuple[str, float]]:
    """name -> (worker, start) of every test of four modules, each with a server test and two others."""
    folder = session.mkdir(f"ran_{order}")
    for n in range(4):
        session.makepyfile(**{f"test_module_{n}": RECORDING_TEST.format(n=n, ran=str(folder))})
    result = session.runpytest_subprocess("-n", "2", "-p", "xdist", f"--server-tests={order}")
    result.assert_outcomes(passed=12)
    ran = {}
    for path in folder.iterdir():
        worker, started = path.read_text().split()
        ran[path.name] = (worker, float(started))
    assert len(ran) == 12, ran
    return ran


@pytest.mark.parametrize("order", ["first", "last"])
def test_under_xdist_the_server_tests_share_one_worker_first_or_after_the_others(
    session: pytest.Pytester, order: str
) -> None:
    ran = _run_recording(session, order)
    server = {name: run for name, run in ran.items() if name.startswith("server")}
    pure = {name: run for name, run in ran.items() if name.startswith("pure")}
    assert len({worker for worker, _ in server.values()}) == 1, ran  # one llama-server and one vLLM
    assert len({worker for worker, _ in pure.values()}) == 2, ran  # the others use both workers
    first_server = min(started for _, started in server.values())
    late = [name for name, (_, started) in pure.items() if started > first_server]
    if order == "first":  # the servers start at once, the others run beside them
        assert len(late) >= 4, ran
    else:  # the others first; at most what the other worker holds when the server tests begin
        assert len(late) <= 2, ran


def test_a_lane_mark_written_by_hand_is_refused(session: pytest.Pytester) -> None:
    session.makepyfile(
        test_by_hand="""
        import pytest

        @pytest.mark.gpu_lane
        def test_claims_a_server():
            pass
        """
    )
    result = session.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_by_hand.py::test_claims_a_server: marked gpu_lane by hand*"])


def test_an_engine_started_without_its_fixture_fails_the_test(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines_dir = session.mkdir("engines")
    (engines_dir / "engine").symlink_to("/bin/true")
    monkeypatch.setenv("LANES_ENGINES_DIR", str(engines_dir))
    session.makepyfile(
        test_undeclared=START_A_CPU_SERVER
        + """

def test_starts_unannounced(tmp_path):
    start(tmp_path)


@pytest.mark.usefixtures("cpu_engine")
def test_starts_with_its_fixture(tmp_path):
    start(tmp_path)


def test_starts_a_stand_in_that_is_no_engine(tmp_path):
    command = ServerCommand("cpu", ["/bin/true"], {}, 9, "/health")
    with pytest.raises(EmbeddedStartError, match="exited with code 0"):
        EmbeddedServer(command, tmp_path, ready_timeout_s=5, publish=False).start()
"""
    )
    # In a process of its own: in this one, this very test's guard wraps EmbeddedServer.start too.
    result = session.runpytest_subprocess("-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_starts_unannounced starts the cpu lane's engine (*engine) but*"])


def test_make_test_runs_two_workers_with_the_server_tests_last_on_fewer_than_4_cores() -> None:
    # On 2 cores the server tests lost to a worker beside them what it saved (1032 vs 1078 s); the others
    # alone on both workers took 134 s instead of 226 s.
    assert [default_workers(cores) for cores in (1, 2, 3, 4, 16)] == [0, 2, 2, 2, 2]
    assert [server_tests_first(cores) for cores in (1, 2, 3, 4, 16)] == [False, False, False, True, True]
