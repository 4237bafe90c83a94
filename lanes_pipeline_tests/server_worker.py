"""With pytest-xdist (`make test` runs two workers): every test that uses a real lane server on one
worker, the tests that need none spread over all workers.

The servers are session fixtures: a second worker running server tests would start a second llama-server
and a second vLLM on the same cores. When the server tests run is the cores' question: on 4 cores or more
they start at once and the others run beside them (`--server-tests=first`); on fewer, the others run first,
over both workers, and the server tests after them, alone (`--server-tests=last`): beside them on 2 cores the
other worker took the server tests' cores (the fast tier went from 1078 to 1032 s of test time, the server
tests from 845 to 1022 s), while the tests that need no server took 226 s in one process and 134 s on two
workers with nothing beside them.

Which tests use a server is known only after collection on a worker (the lane marks come from the fixtures a
test uses, conftest.py), and xdist's controller sees only node ids. So each worker writes the node ids of its
server tests to a file the controller named (`pytest_configure_node`), and the controller's scheduler reads
it when it splits the collection into work units: one unit for every server test, one per module for the
rest. xdist hands the largest units out first and the others as workers run dry; the server unit goes
first or last.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

SERVER_UNIT = "tests on the real lane servers"
WORKER_KEY = "lanes_server_tests_folder"  # in each worker's xdist `workerinput`
FOLDER_KEY = pytest.StashKey[Path]()
ORDER_OPTION = "--server-tests"
ORDERS = ("auto", "first", "last")


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        ORDER_OPTION,
        choices=ORDERS,
        default="auto",
        help="under xdist, run the tests on the real lane servers first (the others beside them) or last "
        "(the others first, over every worker); auto: first on 4 cores or more (server_worker.py)",
    )


def _cores(cores: int | None) -> int:
    return cores or os.cpu_count() or 1


def server_tests_first(cores: int | None = None) -> bool:
    """`--server-tests=auto`: first where the tests that need no server have cores of their own."""
    return _cores(cores) >= 4


def configure_controller(config: pytest.Config) -> None:
    """The controller of an xdist run (not a worker, not a run without -n): a folder for the workers'
    lists."""
    controller = getattr(config, "workerinput", None) is None and config.pluginmanager.hasplugin("xdist")
    if controller and config.getoption("numprocesses", None):
        config.stash[FOLDER_KEY] = Path(tempfile.mkdtemp(prefix="lanes-server-tests-"))


def unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(FOLDER_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def configure_node(node: Any) -> None:
    """Controller side: tell a worker where to write its list (xdist's `pytest_configure_node`)."""
    node.workerinput[WORKER_KEY] = str(node.config.stash[FOLDER_KEY])


def record_server_tests(config: pytest.Config, server_test_ids: list[str]) -> None:
    """Worker side, after collection: its server tests' node ids (written whole, then renamed into place)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKER_KEY not in workerinput:
        return
    target = Path(workerinput[WORKER_KEY]) / f"{workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(sorted(server_test_ids)))
    os.replace(partial, target)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's `pytest_xdist_make_scheduler` for `--dist load` (the default of `-n`); other modes keep
    xdist's own."""
    if config.getoption("dist") != "load" or FOLDER_KEY not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = config.stash[FOLDER_KEY]
    order = config.getoption(ORDER_OPTION, "auto")
    first = server_tests_first() if order == "auto" else order == "first"

    class ServerTestsOnOneWorker(LoadScopeScheduling):
        server_tests: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.server_tests is None:
                self.server_tests = read_server_tests(folder)
            return SERVER_UNIT if nodeid in self.server_tests else super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if SERVER_UNIT in self.workqueue:
                self.workqueue.move_to_end(SERVER_UNIT, last=not first)
            super()._assign_work_unit(node)

    return ServerTestsOnOneWorker(config, log)


def read_server_tests(folder: Path) -> frozenset[str]:
    """The server tests the workers reported (xdist has checked they all collected the same tests)."""
    lists = sorted(folder.glob("*.json"))
    if not lists:
        raise pytest.UsageError(
            f"no worker reported its server tests in {folder}: lanes_pipeline_tests/conftest.py's "
            f"collection hook did not run on the xdist workers"
        )
    return frozenset(json.loads(lists[0].read_text()))


def default_workers(cores: int | None = None) -> int:
    """`make test`'s xdist workers: two wherever there are two cores (one process on one)."""
    return 2 if _cores(cores) >= 2 else 0


if __name__ == "__main__":  # the Makefile's TEST_WORKERS
    print(default_workers())
