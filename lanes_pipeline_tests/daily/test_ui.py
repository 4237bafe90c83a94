"""The Dagster UI as people use it: `dagster-webserver` loads the code location from workspace.yaml, its
GraphQL API lists our assets with groups, descriptions, daily partitions, the daily job and its schedule,
and headless chromium renders the asset graph page showing our asset groups (screenshot kept in tmp)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dagster import AssetKey
from websockets.sync.client import connect

from lanes_pipeline.definitions import defs as load_defs
from lanes_pipeline.settings import project_root
from lanes_pipeline_tests import browser
from lanes_pipeline_tests.browser import HEADLESS_FLAGS, ensure_chromium

GROUPS = {"lanes", "cpu_lane", "dataset", "gpu_lane"}
ASSETS_QUERY = """
{
  assetNodes {
    assetKey { path }
    groupName
    description
    isPartitioned
    partitionKeys
    jobNames
  }
}
"""
LOCATION_QUERY = """
{
  workspaceOrError {
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message }
          ... on RepositoryLocation { repositories { name schedules { name cronSchedule } } }
        }
      }
    }
  }
}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Webserver:
    def __init__(self, url: str) -> None:
        self.url = url

    def graphql(self, query: str) -> dict[str, Any]:
        response = httpx.post(f"{self.url}/graphql", json={"query": query}, timeout=120)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]


@pytest.fixture(scope="module")
def webserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webserver]:
    """`dagster-webserver -w workspace.yaml` on a free port, on an instance of its own."""
    home = tmp_path_factory.mktemp("ui-dagster-home")
    shutil.copy(project_root() / "dagster.yaml", home / "dagster.yaml")
    port = _free_port()
    log = (home / "webserver.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster_webserver",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=project_root(),
        env={**os.environ, "DAGSTER_HOME": str(home)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Webserver(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, (home / "webserver.log").read_text()[-3000:]
            try:
                entries = server.graphql(LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    break
            except (httpx.HTTPError, KeyError):
                pass
            time.sleep(1)
        else:
            pytest.fail("dagster-webserver did not load the code location in 300 s")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def test_webserver_loads_the_code_location_with_its_job_and_schedule(webserver: Webserver) -> None:
    [entry] = webserver.graphql(LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
    location = entry["locationOrLoadError"]
    assert entry["name"] == "lanes_pipeline"
    assert location["__typename"] == "RepositoryLocation", location
    [repository] = location["repositories"]
    schedules = {s["name"]: s["cronSchedule"] for s in repository["schedules"]}
    assert schedules["daily_lanes_schedule"] == "0 4 * * *"


def test_graphql_lists_our_assets_with_groups_and_daily_partitions(webserver: Webserver) -> None:
    nodes = {"/".join(n["assetKey"]["path"]): n for n in webserver.graphql(ASSETS_QUERY)["assetNodes"]}
    graph = load_defs().get_repository_def().asset_graph
    ours = {key.to_user_string() for key in graph.materializable_asset_keys}
    assert ours <= set(nodes)
    assert {nodes[name]["groupName"] for name in ours} == GROUPS  # by lane, the dataset between
    for name in ours:
        node = nodes[name]
        assert node["description"], f"{name} has no description"
        # every asset is in daily_lanes but the lane benchmark, which has a daily job of its own
        job = "lane_benchmarks_daily" if name == "lane_benchmarks" else "daily_lanes"
        assert job in node["jobNames"], name
        if graph.get(AssetKey.from_user_string(name)).partitions_def is not None:
            assert node["isPartitioned"] and node["partitionKeys"][0] == "2026-11-01", name
    assert nodes["repo_snapshot"]["isPartitioned"] and not nodes["cpu_lane_probe"]["isPartitioned"]


# -- the asset graph in a real browser ---------------------------------------------------------------------


class DevTools:
    """The Chrome DevTools protocol over one page's websocket: enough to wait, inspect and screenshot."""

    def __init__(self, ws_url: str) -> None:
        self.ws = connect(ws_url, max_size=64 * 1024 * 1024, open_timeout=30)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=120))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def __enter__(self) -> DevTools:
        self.ws.__enter__()  # websockets 17 wants its sync connection used as a context manager
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.__exit__(*exc)  # type: ignore[arg-type]


# The graph's group boxes (CollapsedGroupNode / ExpandedGroupNode components, not the sidebar's tree) whose
# own text is a group name, inside the viewport and on top (not under a dialog): where they are on screen.
GROUP_BOXES = """
(() => {
  const names = %s;
  const found = {};
  for (const el of document.querySelectorAll('body *')) {
    const texts = Array.from(el.childNodes).filter(n => n.nodeType === 3);
    const own = texts.map(n => n.textContent).join('').trim();
    if (!names.includes(own)) continue;
    let box = el;
    while (box && !/GroupNode/.test(typeof box.className === 'string' ? box.className : '')) {
      box = box.parentElement;
    }
    if (!box) continue;
    const r = el.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    if (r.width <= 0 || r.height <= 0 || x < 0 || y < 0 || x > window.innerWidth || y > window.innerHeight) {
      continue;
    }
    const hit = document.elementFromPoint(x, y);
    if (hit && box.contains(hit)) {
      found[own] = [Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)];
    }
  }
  return found;
})()
"""


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def chromium() -> Path:
    found = ensure_chromium()
    if isinstance(found, str):
        pytest.skip(f"chromium could not be installed on this machine: {found}")
    return found


@pytest.mark.slow
def test_the_asset_graph_page_shows_our_groups(webserver: Webserver, chromium: Path, tmp_path: Path) -> None:
    # On localhost the UI greets a new instance with a "Join the Dagster community" dialog over the graph
    # (it opens a second after the page loads, so dismissing it from the page races it). Mark it seen on the
    # instance, as its own dismiss button does, so the graph is what the screenshot and the hit test see.
    webserver.graphql("mutation { setNuxSeen }")
    assert webserver.graphql("{ shouldShowNux }")["shouldShowNux"] is False
    url = f"{webserver.url}/asset-groups"
    browser = subprocess.Popen(
        [
            str(chromium),
            *HEADLESS_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--remote-debugging-port=0",
            "--window-size=1600,1000",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert browser.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = browser.stderr.readline()
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(match.group(1)) if match else None
            assert line or browser.poll() is None, "chromium exited before DevTools came up"
        assert port is not None, "chromium did not report its DevTools port"
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        with DevTools(pages[0]["webSocketDebuggerUrl"]) as tools:
            tools.call(
                "Emulation.setDeviceMetricsOverride",
                width=1600,
                height=1000,
                deviceScaleFactor=1,
                mobile=False,
            )
            labels: dict[str, list[int]] = {}
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                labels = tools.evaluate(GROUP_BOXES % json.dumps(sorted(GROUPS))) or {}
                statuses_loaded = "fetching statuses" not in (tools.evaluate("document.body.innerText") or "")
                if set(labels) == GROUPS and statuses_loaded:
                    break
                time.sleep(1)
            # Let the graph finish its layout animation before the picture; while it moves, a label can be
            # off screen for a moment, so read the boxes again until all groups are back (bounded).
            settle_deadline = time.monotonic() + 20
            while True:
                time.sleep(1)
                labels = tools.evaluate(GROUP_BOXES % json.dumps(sorted(GROUPS))) or {}
                if set(labels) == GROUPS or time.monotonic() > settle_deadline:
                    break
            png = base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"])
            text = tools.evaluate("document.body.innerText") or ""
    finally:
        browser.terminate()
        browser.wait(timeout=30)
    shot = tmp_path / "asset-graph.png"
    shot.write_bytes(png)
    print(f"screenshot: {shot}; group labels on screen at {labels}")
    assert set(labels) == GROUPS, f"groups on screen: {labels}; page text: {text[:500]!r}"
    width, height = _png_size(png)
    assert (width, height) == (1600, 1000) and len(png) > 20_000


def test_where_chromium_cannot_be_installed_the_reason_is_kept_for_the_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine without chromium and without apt-get: no install, and the reason the screenshot test
    skips with is written where `make test` leaves it."""
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser, "project_root", lambda: tmp_path)
    reason = browser.ensure_chromium()
    assert reason == "apt-get is not available on this machine (not Debian/Ubuntu)"
    assert (tmp_path / browser.REASON_FILE).read_text().strip() == reason
