"""`python -m lanes_pipeline.bench [NAME ...]`: run the benchmarks, write a JSON and a Markdown report.
`python -m lanes_pipeline.bench --docs`: write docs/benchmarks.md from that report (runs nothing)."""

from __future__ import annotations

import argparse
import importlib
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from lanes_pipeline.bench.report import (
    BenchEntry,
    BenchReportError,
    doc_sections,
    read_report,
    report_markdown,
)
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline.steps import STOP_REQUESTED

BENCHMARKS = ("cpu_lane", "gpu_lane", "trials", "cpu_yield", "cpu_servers", "learning", "drills")
# Run only when named: `suite` runs the whole test suite (over an hour here), not a lane's figures;
# `judge_cost` compares the evaluation's levers (what `learning` measures as a whole); `alias_moves` is
# gpu_lane's hot swap with many moves; `gate` is the review gate against its hostile corpus (a sandbox run
# per accepted input: minutes).
ON_REQUEST = ("suite", "judge_cost", "alias_moves", "gate")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _report_path(settings: Settings) -> Path:
    return settings.data_dir / "bench" / "report.json"


def write_docs(source: Path, docs: Path, root: Path) -> Path:
    """`docs` (docs/benchmarks.md) from the report at `source`, as it stands; paths shown from `root`. A
    benchmark the report has no run of keeps its section from the page as it was."""
    report = read_report(source)
    docs.parent.mkdir(parents=True, exist_ok=True)
    shown = source.relative_to(root) if source.is_relative_to(root) else source
    kept = doc_sections(docs.read_text()) if docs.exists() else {}
    docs.write_text(report_markdown(report, str(shown), kept))
    return docs


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m lanes_pipeline.bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        help=f"benchmarks to run (all of {', '.join(BENCHMARKS)}); by name only: {', '.join(ON_REQUEST)}",
    )
    parser.add_argument("--docs", action="store_true", help="write docs/benchmarks.md from the report")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS + ON_REQUEST]
    if unknown:
        known = ", ".join(BENCHMARKS + ON_REQUEST)
        parser.error(f"no benchmark named {', '.join(unknown)}; the benchmarks: {known}")
    # A SIGTERM (a `timeout`, CI) unwinds like Ctrl-C, so each benchmark's finally-blocks stop its servers.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = load_settings()
    if args.docs:
        root = settings.project_root
        print(f"[bench] wrote {write_docs(_report_path(settings), root / 'docs' / 'benchmarks.md', root)}")
        return
    path = _report_path(settings)
    report = read_report(path)
    machine = (
        f"{platform.machine()}, {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    )
    report.started, report.machine = datetime.now(UTC).isoformat(timespec="seconds"), machine
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in args.names or BENCHMARKS:
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
        # Each benchmark's figures replace its own entry only, with when, where and with which configs.
        report.results[name] = BenchEntry.model_validate(
            result
            | {
                "wall_s": round(time.perf_counter() - started, 1),
                "started": began,
                "machine": machine,
                "config_dir": str(settings.config_dir),
            }
        )
    path.write_text(report.model_dump_json(indent=2, exclude_none=True) + "\n")
    (path.parent / "report.md").write_text(report_markdown(report, str(path)))
    print(f"[bench] wrote {path} and {path.parent / 'report.md'}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BenchReportError as exc:
        raise SystemExit(str(exc)) from None
