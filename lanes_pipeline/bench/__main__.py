"""`python -m lanes_pipeline.bench [NAME ...]`: run the benchmarks, write a JSON and a Markdown report."""

from __future__ import annotations

import importlib
import json
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from lanes_pipeline.host import STOP_REQUESTED
from lanes_pipeline.settings import load_settings

BENCHMARKS = ("cpu_lane", "gpu_lane", "trials", "cpu_yield", "cpu_servers", "learning", "drills")


def _markdown(report: dict[str, Any]) -> str:
    lines = [f"# lanes_pipeline benchmarks ({report['started']})", "", f"Machine: {report['machine']}", ""]
    for name, result in report["results"].items():
        lines += [f"## {name}", ""]
        summary = result.get("markdown")
        if summary:
            lines += [summary, ""]
        else:
            lines += ["```json", json.dumps(result, indent=2), "```", ""]
    return "\n".join(lines)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _existing(path: Path) -> dict[str, Any]:
    """The report as earlier runs left it; a file that is not a report is named, never overwritten."""
    if not path.exists():
        return {}
    try:
        report = json.loads(path.read_text())
    except ValueError as exc:
        raise SystemExit(f"{path}: not a benchmark report ({exc}); move it away to start a new one") from exc
    if not isinstance(report, dict) or not isinstance(report.get("results", {}), dict):
        raise SystemExit(f"{path}: not a benchmark report (no 'results' object); move it away")
    return report


def main(names: list[str]) -> None:
    # A SIGTERM (a `timeout`, CI) unwinds like Ctrl-C, so each benchmark's finally-blocks stop its servers.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = load_settings()
    out_dir = settings.data_dir / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    report = _existing(out_dir / "report.json") | {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
    }
    report.setdefault("results", {})
    for name in names or BENCHMARKS:
        try:
            module = importlib.import_module(f"lanes_pipeline.bench.{name}")
        except ModuleNotFoundError:
            print(f"[bench] {name}: not present, skipped", file=sys.stderr)
            continue
        started, began = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
        try:
            result = module.run(settings)
        except Exception:
            if STOP_REQUESTED.is_set():  # a step stopped by the signal: Dagster raised its Failure
                raise KeyboardInterrupt from None
            raise
        # Each benchmark's figures replace its own entry only: benchmarks run one at a time (hours each on
        # two cores), and the report keeps the latest run of every one, with when and with which configs.
        report["results"][name] = result | {
            "wall_s": round(time.perf_counter() - started, 1),
            "started": began,
            "config_dir": str(settings.config_dir),
        }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "report.md").write_text(_markdown(report))
    print(f"[bench] wrote {out_dir / 'report.json'} and {out_dir / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
