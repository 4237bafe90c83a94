"""Starting, watching and stopping the real local servers behind `base_url: embedded`.

A started server runs in its own process group, so stopping it takes its children along (vLLM forks an
engine core). While it runs, `<data>/run/<lane>.json` says where it is, so resources in other processes
(a `dagster dev` run, the CLI) find it instead of starting a second one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.moe_model import embedded_cpu_gguf
from lanes_pipeline.errors import (
    EmbeddedStartError,
    LaneError,
    LaneNotReadyError,
    LaneUnreachableError,
    PortInUseError,
    log_tail,
)
from lanes_pipeline.settings import CpuLane, GpuLane, LaneName, Settings

LANE_LABEL: dict[LaneName, str] = {"cpu": "CPU", "gpu": "GPU"}
# How long a server may take to stop on SIGTERM before it is killed. vLLM stops its engine processes in
# seconds. llama-server exits at once, unless an HTTP handler waits on a task that will never be answered
# (a slot action on an ik built without embedded/ik_patches.py): then it never exits, and waiting longer only
# delays the kill.
STOP_GRACE_S: dict[LaneName, float] = {"cpu": 5.0, "gpu": 20.0}


def _port_owner(port: int) -> str | None:
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({' '.join(proc.cmdline()[:3])})"
    except (psutil.Error, OSError):
        return None
    return None


def choose_port(lane: LaneName, port: int) -> int:
    """The configured port if it is free (0: any free port); a taken port is reported, never shared."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise PortInUseError(LANE_LABEL[lane], port, _port_owner(port)) from None
        return sock.getsockname()[1]


@dataclass
class ServerCommand:
    lane: LaneName
    argv: list[str]
    env: dict[str, str]
    port: int
    ready_path: str  # GET this until 200


# ik_llama.cpp's flash-attention kernels (on by default) abort the server (`GGML_ASSERT(S > 0)` in
# iqk_fa_templates.h) as soon as two slots decode at once: they skip K blocks by looking at the first cell of
# each block only, which with several slots in one unified KV cache belongs to another sequence, so a row's
# whole softmax is masked. No other flag (batch sizes, KV types, graph reuse, cache-ram, threads) avoids it.
# With -fa off it holds, but two prompts that fill their slots' context fail together with HTTP 500 ("KV
# cache is full") and go on failing: each decode call of up to -b tokens is split into -ub batches, and when a
# later one finds no room the cells the earlier ones took are not given back. With -b equal to -ub a decode
# call is one batch that either fits or takes nothing. Why 32 and not the default 512: ik's batched prompt
# path (micro-batches of 64+ tokens, Q4_1) gives other logits than one token at a time, so at temperature 0
# a prompt evaluated whole was answered differently from the same prompt served from the prefix cache (3-7
# of 10 prompts; upstream 1), sometimes with end-of-text at once, and the regression oracles got 0 of 6
# targets (with 32: 1 of 10 prompts differed, and the oracle test passes), while prompt speed on 2 cores
# stayed within a few percent of 512's at 391-1544 prompt tokens. Each default stands unless extra_args
# sets it.
IK_DEFAULTS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("-fa", "--flash-attn", "-no-fa", "--no-flash-attn"), ("-fa", "off")),
    # One pair: a user who sets either size sets the batching, and gets neither of ours.
    (("-b", "--batch-size", "-ub", "--ubatch-size"), ("-b", "32", "-ub", "32")),
)


# HTTP handler threads beyond one per slot: the pollers (bandwidth governor, Prometheus, the observatory),
# health checks and slot actions. Both servers default to max(slots + 2, cores - 1): on 2 cores that is 4,
# and an ik built without embedded/ik_patches.py never frees the handler of a slot action whose answer it
# dropped, so two such losses left a 2-slot server running one completion at a time beside a poller. The
# embedded ik has the fixes; the spares keep a user's own build of the engine from losing a slot that way.
SPARE_HTTP_THREADS = 8


def http_threads(parallel: int) -> int:
    """llama-server --threads-http: a handler per slot and the spares, never fewer than the server's own
    default on a machine with many cores."""
    return max(parallel + SPARE_HTTP_THREADS, (os.cpu_count() or 1) - 1)


def llama_server_command(lane: CpuLane, data: Path, port: int) -> ServerCommand:
    """The embedded CPU lane's llama-server (the configured engine) with the lane's settings, then
    `embedded.extra_args` as given: a flag the server does not know stops it at start with its own message."""
    embedded = lane.embedded
    binary = engines.cpu_server_binary(embedded.engine, data)
    argv = [
        str(binary),
        "-m",
        str(embedded_cpu_gguf(embedded, data)),
        "-a",
        lane.model_alias,
        "-np",
        str(embedded.parallel),
        "-c",
        str(embedded.ctx_size),
        "--metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if embedded.threads:
        argv += ["-t", str(embedded.threads)]
    given = {arg.split("=", 1)[0] for arg in embedded.extra_args}
    if "--slot-save-path" not in given:
        # Both servers served a prefix only from the slot that evaluated it (a group of 8 on 2 slots: 0.857 of
        # the layout's limit on each); with slot files the batch copies that slot into the others
        # (cpu_lane/batching/slot_copy.py). ik joins this path and the file name as given: hence the slash.
        argv += ["--slot-save-path", f"{_slot_dir(data, port)}/"]
    if "--threads-http" not in given:
        argv += ["--threads-http", str(http_threads(embedded.parallel))]
    for flags, default in IK_DEFAULTS if embedded.engine == "ik_llama" else ():
        if not given.intersection(flags):
            argv += default
    argv += embedded.extra_args
    key = lane.api_key()
    # The server's own shared libraries lie beside it (both engines); LD_LIBRARY_PATH wins over a RUNPATH.
    env = {"LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    if key:
        env["LLAMA_API_KEY"] = key  # upstream llama-server reads it; keeps the key off the process list
        if embedded.engine == "ik_llama":  # ik reads no key from the environment: a private file instead
            argv[1:1] = ["--api-key-file", str(_key_file(data, port, key))]
    return ServerCommand("cpu", argv, env, port, "/health")


def _slot_dir(data: Path, port: int) -> Path:
    path = data / "run" / f"cpu-lane-{port}-slots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key_file(data: Path, port: int, key: str) -> Path:
    path = data / "run" / f"cpu-lane-{port}.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return path


# CPU flags with which the CPU build of vLLM computes bfloat16 natively; without them it converts each value.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo is not there to read)."""
    with suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "flags":
                return frozenset(value.split())
    return frozenset()


def embedded_dtype(flags: frozenset[str]) -> str:
    """The embedded vLLM's --dtype for `dtype: native` (the default): bfloat16 where the CPU has it natively,
    else float32 (with AVX2 alone, a LoRA answer of 32 tokens after a 327-token prompt took 16.9 s in
    bfloat16 and 7.4 s in float32; the base model's 11.9 s and 3.8 s)."""
    return "bfloat16" if flags & NATIVE_BF16_FLAGS else "float32"


def vllm_reserved_cpus(configured: int | None, cpus: int) -> int | None:
    """VLLM_CPU_NUM_OF_RESERVED_CPU for the embedded vLLM (None: leave it to vLLM). vLLM keeps one CPU for
    its engine loop; on 2 CPUs that halves the model's threads: 24 answers of 128 tokens ran at 63-80
    tokens/s with it and 108-130 without (two A B A B runs of tools/vllm_reserved_cpus.py). The setting:
    `gpu_lane.embedded.reserved_cpus`."""
    if configured is not None:
        return configured
    return 0 if cpus <= 2 else None


def vllm_server_command(lane: GpuLane, data: Path, port: int) -> ServerCommand:
    python = engines.vllm_python(data)
    model_dir = engines.embedded_hf_model(data)
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        lane.served_model_name,
        "--enable-lora",
        "--max-loras",
        str(lane.max_loras),
        "--max-lora-rank",
        str(lane.max_lora_rank),
        "--max-model-len",
        str(lane.embedded.max_model_len),
        "--dtype",
        embedded_dtype(cpu_flags()) if lane.embedded.dtype == "native" else lane.embedded.dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
        "VLLM_CPU_KVCACHE_SPACE": str(lane.embedded.kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    reserved = vllm_reserved_cpus(lane.embedded.reserved_cpus, os.cpu_count() or 1)
    if reserved is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
    key = lane.api_key()
    if key:
        env["VLLM_API_KEY"] = key
    return ServerCommand("gpu", argv, env, port, "/v1/models")


def server_log_path(data_dir: Path, lane: LaneName, port: int, publish: bool) -> Path:
    """`logs/<lane>-lane-server.log` for the lane's published server; a private one (a test's, a
    benchmark's) writes its own, named by its port: servers of one lane side by side never truncate each
    other's log, so a crashed session server's last words survive the private servers started after it."""
    name = f"{lane}-lane-server.log" if publish else f"{lane}-lane-server-{port}.log"
    return data_dir / "logs" / name


class EmbeddedServer:
    """One real server process: start it, wait until it answers, stop it with its whole process group."""

    def __init__(
        self, command: ServerCommand, data_dir: Path, ready_timeout_s: float, publish: bool = True
    ) -> None:
        self.command = command
        self.publish = publish  # tests run private servers that `make dev` must not pick up
        self.ready_timeout_s = ready_timeout_s
        self.log_path = server_log_path(data_dir, command.lane, command.port, publish)
        self.state_path = state_file(data_dir, command.lane)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.command.port}"

    @property
    def label(self) -> str:
        return LANE_LABEL[self.command.lane]

    def start(self) -> EmbeddedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.command.env},
            cwd=self.log_path.parent,  # ik's llama-server writes llama.log into its working directory
            start_new_session=True,  # its own process group: stop() reaches vLLM's engine core too
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        if self.publish:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.state_path.write_text(json.dumps({"url": self.url, "pid": self.process.pid}))
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout_s
        last = "no answer yet"
        headers = _auth_headers(self.command.env.get("LLAMA_API_KEY") or self.command.env.get("VLLM_API_KEY"))
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise EmbeddedStartError(
                        f"the embedded {self.label} lane server exited with code {code} while starting",
                        log_path=self.log_path,
                        tail=_exit_tail(self.log_path),
                    )
                try:
                    response = client.get(self.url + self.command.ready_path)
                    # Our process must still be alive: a 200 from someone else's server proves nothing.
                    if response.status_code == 200 and self.process.poll() is None:
                        return
                    last = f"HTTP {response.status_code}"
                except httpx.TransportError as exc:
                    last = type(exc).__name__
                time.sleep(0.5)
        raise EmbeddedStartError(
            f"the embedded {self.label} lane server did not become ready within "
            f"{self.ready_timeout_s:.0f} s (last answer: {last})",
            log_path=self.log_path,
            tail=log_tail(self.log_path),
        )

    def stop(self) -> None:
        self._unpublish()
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S[self.command.lane])
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            pass  # too slow, or a second Ctrl-C / SIGTERM: no more waiting
        finally:
            # A server that did not stop, and anything it forked and left behind in its group, goes too.
            _signal_group(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_GRACE_S[self.command.lane])

    def kill(self) -> None:
        """SIGKILL the whole group at once: what a crash looks like, for resume tests."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None
        self._unpublish()

    def _unpublish(self) -> None:
        if self.publish:
            self.state_path.unlink(missing_ok=True)


def _exit_tail(log_path: Path) -> str:
    """The log's error lines, then its last lines: ik_llama.cpp's server prints `error: unknown argument: X`
    first and its 400-line usage after it, so the last lines alone would not name the flag it rejected."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return log_tail(log_path)
    errors = [line for line in lines[:50] if line.lower().startswith("error")]
    tail = log_tail(log_path)
    return "\n".join([*errors, tail]) if errors and errors[-1] not in tail else tail


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def state_file(data_dir: Path, lane: LaneName) -> Path:
    return data_dir / "run" / f"{lane}-lane.json"


def running_embedded_url(data_dir: Path, lane: LaneName) -> str | None:
    """The URL of an embedded server another process started, if it is still alive."""
    path = state_file(data_dir, lane)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not psutil.pid_exists(int(state.get("pid", -1))):
        path.unlink(missing_ok=True)
        return None
    return str(state["url"])


def build_server(
    settings: Settings, lane: LaneName, port: int | None = None, publish: bool = True
) -> EmbeddedServer:
    """An embedded server for `lane`, not yet started; `port` overrides the configured one (0: any free)."""
    config = settings.lanes.cpu_lane if lane == "cpu" else settings.lanes.gpu_lane
    return build_lane_server(config, settings.data_dir, port, publish)


def build_lane_server(
    config: CpuLane | GpuLane, data_dir: Path, port: int | None = None, publish: bool = True
) -> EmbeddedServer:
    """The embedded server of the lane `config` describes (a resource's own lane config, whatever folder it
    was read from), not yet started."""
    lane: LaneName = "cpu" if isinstance(config, CpuLane) else "gpu"
    port = choose_port(lane, config.embedded.port if port is None else port)
    if isinstance(config, CpuLane):
        command = llama_server_command(config, data_dir, port)
    else:
        command = vllm_server_command(config, data_dir, port)
    return EmbeddedServer(command, data_dir, config.ready_timeout_s, publish=publish)


def check_reachable(lane: LaneName, url: str, api_key: str | None, timeout_s: float) -> None:
    """An external server must answer before work is sent to it; say which URL and what was tried."""
    tried = f"GET {url}/v1/models"
    try:
        response = httpx.get(f"{url}/v1/models", headers=_auth_headers(api_key), timeout=timeout_s)
    except httpx.TransportError as exc:
        raise LaneUnreachableError(LANE_LABEL[lane], url, tried, f"{type(exc).__name__}: {exc}") from exc
    if response.status_code == 503:
        raise LaneNotReadyError(LANE_LABEL[lane], url, 0, "HTTP 503 (model loading)")
    if response.status_code in (401, 403):
        raise LaneError(
            f"{LANE_LABEL[lane]} lane at {url} refused the API key ({tried}: HTTP {response.status_code}); "
            f"check {lane}_lane.api_key_env in configs/lanes.yaml"
        )
    if response.status_code != 200:
        raise LaneUnreachableError(LANE_LABEL[lane], url, tried, f"HTTP {response.status_code}")


@dataclass(frozen=True)
class LaneEndpoints:
    cpu_url: str | None
    gpu_url: str | None

    def url(self, lane: LaneName) -> str:
        url = self.cpu_url if lane == "cpu" else self.gpu_url
        if url is None:
            raise LaneError(f"the {LANE_LABEL[lane]} lane was not started")
        return url


@contextmanager
def running_lanes(
    settings: Settings, lanes: tuple[LaneName, ...] = ("cpu", "gpu")
) -> Iterator[LaneEndpoints]:
    """Yield the URL of each lane: an external one checked reachable, an embedded one started (or reused
    when another process of ours already runs it) and stopped on exit, even when the body fails."""
    urls: dict[LaneName, str] = {}
    with ExitStack() as stack:
        for lane in lanes:
            config = settings.lanes.cpu_lane if lane == "cpu" else settings.lanes.gpu_lane
            if not config.is_embedded:
                check_reachable(lane, config.base_url, config.api_key(), config.connect_timeout_s)
                urls[lane] = config.base_url
                continue
            already = running_embedded_url(settings.data_dir, lane)
            if already is not None:
                urls[lane] = already
                continue
            server = build_server(settings, lane)
            stack.callback(server.stop)
            urls[lane] = server.start().url
        yield LaneEndpoints(cpu_url=urls.get("cpu"), gpu_url=urls.get("gpu"))
