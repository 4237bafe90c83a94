"""`cpu_yield`: what the CPU lane yields on the shipped sample repository, day by day, with the embedded
model.

A private llama-server on a free port and an empty data folder (LANES_DATA_DIR set to a temporary folder for
the run: no memo, response cache or artifact of an earlier run counts; only the converted base model is
linked in, for the dataset's tokenizer). The sample's days are materialized in order through the CPU-lane
assets (repo_snapshot -> repo_analysis -> generated_tests -> generated_docs and refactor_proposals ->
lora_dataset), and `results.cpu_yield` gets, per task kind, verified_sampling.KindYield (asked, sampled,
accepted, targets_with_accepted, pass_at_1, pass_at_n):

- `analysis`: repo_analysis's symbols (one answer each, not sampled; one target per symbol and day);
- `tests`: generated_tests, which works symbol by symbol (tests_day.py): each day's changed symbols, then
  the backlog (`backlog_per_day`), `samples_per_item` answers per symbol, each a set of regression oracles
  accepted only if it passes the sandbox runs and kills both mutants of its symbol; one target per symbol
  and day;
- `refactor`: refactor_proposals's symbols (one diff each, not sampled, confined to the symbol's lines; one
  target per symbol and day);
- `docs`: generated_docs, on generated_tests' symbols of each day (docstring_day): `samples_per_item`
  docstrings per symbol, each accepted only if it names every parameter and its `>>>` examples pass as
  doctests in the sandbox; one target per symbol and day;

each with `reviewer_refusals_caught` (analysis, tests, docs): the answers the checks a reviewer would make
refused (issue 54; `reviewer_refusals`);

and `dataset_rows`: lora_dataset's train + eval rows over the days, with the targets of issue 11; then
`real_package` (bench/real_package.py): a real PyPI package's releases, one a day, through the same assets
from another empty data folder, with the files left out for size and the day every symbol is covered.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, load_assets_from_modules, materialize

from lanes_pipeline.bench import real_package
from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.jobs.rows import AnalysisRow, GeneratedDocRow, GeneratedTestRow, RefactorRow
from lanes_pipeline.cpu_lane.jobs.verified_sampling import KindYield, TargetTally, kind_yield
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.writer import DatasetFigures
from lanes_pipeline.definitions import CPU_DAY_MODULES
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.repos.sample_repo import HISTORY
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline.store import ArtifactStore

KINDS = ("analysis", "tests", "refactor", "docs")
TARGET_DATASET_ROWS = 40
TARGET_TESTS_SHARE = 0.3
NOT_SAMPLED = "one answer per symbol of the day (not sampled): pass_at_n is pass@1"


@contextmanager
def empty_data_dir(real: Path) -> Iterator[Path]:
    """LANES_DATA_DIR pointing at a fresh folder for the duration; the converted models are linked in."""
    previous = os.environ.get("LANES_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="lanes-bench-yield-") as folder:
        root = Path(folder)
        root.chmod(0o755)  # the sandbox's unprivileged uid reads the sample repository below it
        if (real / "models").is_dir():
            (root / "models").symlink_to(real / "models")
        os.environ["LANES_DATA_DIR"] = str(root)
        try:
            yield root
        finally:
            if previous is None:
                os.environ.pop("LANES_DATA_DIR", None)
            else:
                os.environ["LANES_DATA_DIR"] = previous


def sample_days() -> list[str]:
    return [when.date().isoformat() for when, _, _ in HISTORY]


def _materialize(
    settings: Settings, url: str, root: Path, days: Sequence[str]
) -> tuple[ArtifactStore, dict[str, dict[str, dict[str, Any]]]]:
    """The CPU-lane assets for each day in order; the store, and each asset's metadata per day."""
    store = ArtifactStore(root / "artifacts")
    cpu = CpuLaneResource.from_lanes(settings.lanes, base_url=url)
    resources = {
        "cpu_lane": cpu,
        "artifact_store": ArtifactStoreResource(root=str(store.root)),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
        "lora_training": LoraTrainingResource.from_config(settings.training),
    }
    assets = partitioned_daily(
        load_assets_from_modules(CPU_DAY_MODULES),
        daily_partitions(settings),  # type: ignore[arg-type]
    )
    instance = DagsterInstance.ephemeral()
    metadata: dict[str, dict[str, dict[str, Any]]] = {}
    for day in days:
        result = materialize(assets, resources=resources, partition_key=day, instance=instance)
        if not result.success:
            raise RuntimeError(f"cpu_yield: the CPU-lane assets failed on {day}")
        metadata[day] = {
            event.asset_key.to_user_string(): {k: v.value for k, v in event.materialization.metadata.items()}
            for event in result.get_asset_materialization_events()
        }
        print(f"[bench] cpu_yield: {day} materialized", flush=True)
    return store, metadata


def _target(day: str, repo: str, path: str, symbol: str | None) -> str:
    return f"{day}:{repo}:{path}" + (f"::{symbol}" if symbol else "")


def _one_answer_kind(rows: list[tuple[str, bool]], note: str) -> KindYield:
    return kind_yield([TargetTally(target=t, sampled=1, accepted=int(ok)) for t, ok in rows], note=note)


def analysis_yield(store: ArtifactStore, days: Sequence[str]) -> KindYield:
    rows = [
        (_target(day, repo.repo, item.path, item.symbol), bool(item.accepted))
        for day in days
        for repo in read_results(store, "repo_analysis", day, AnalysisRow)
        for item in repo.files
    ]
    return _one_answer_kind(rows, NOT_SAMPLED)


def refactor_yield(store: ArtifactStore, days: Sequence[str]) -> KindYield:
    rows = [
        (_target(day, row.repo, row.path, row.symbol), row.accepted)
        for day in days
        for row in read_results(store, "refactor_proposals", day, RefactorRow)
    ]
    return _one_answer_kind(rows, NOT_SAMPLED)


def dataset_rows(metadata: dict[str, dict[str, dict[str, Any]]], days: Sequence[str]) -> dict[str, int]:
    """Train and eval rows of each day's lora_dataset (its own rows, not the replay window), summed."""
    missing = [d for d in days if "lora_dataset" not in metadata.get(d, {})]
    if missing:
        raise RuntimeError(f"cpu_yield: lora_dataset was not materialized on {', '.join(missing)}")
    figures = [DatasetFigures.read(metadata[d]["lora_dataset"]) for d in days]
    return {"train": sum(f.train_rows for f in figures), "eval": sum(f.eval_rows for f in figures)}


def tests_yield(store: ArtifactStore, days: Sequence[str]) -> tuple[KindYield, list[GeneratedTestRow]]:
    """generated_tests' symbols (regression oracles, sampled): one target per symbol row and day."""
    rows = [row for day in days for row in read_results(store, "generated_tests", day, GeneratedTestRow)]
    tallies = [
        TargetTally(
            target=f"{r.repo}:{r.path}::{r.symbol}", sampled=r.sampled or 0, accepted=r.accepted_answers or 0
        )
        for r in rows
    ]
    return kind_yield(tallies), rows


def docs_yield(store: ArtifactStore, days: Sequence[str]) -> KindYield:
    """generated_docs' symbols (docstrings, sampled): one target per symbol row and day."""
    tallies = [
        TargetTally(
            target=f"{day}:{r.repo}:{r.path}::{r.symbol}", sampled=r.sampled, accepted=r.accepted_answers
        )
        for day in days
        for r in read_results(store, "generated_docs", day, GeneratedDocRow)
    ]
    return kind_yield(tallies)


def reviewer_refusals(store: ArtifactStore, days: Sequence[str]) -> dict[str, int]:
    """Per asset, the answers refused by the checks a reviewer would make (issue 54), summed over the days:
    analyses the code contradicts; tests (or calls of them) of an exception the target does not raise on
    purpose or whose guard does not decide it; docstrings stating what the code does not bear out or
    replacing the author's. refactor_proposals has no such check of its own (the suite is its gate)."""
    analysis = sum(
        (item.reason or "").startswith("contradicts the code")
        for day in days
        for repo in read_results(store, "repo_analysis", day, AnalysisRow)
        for item in repo.files
    )
    tests = sum(
        r.reviewer_refusals or 0
        for day in days
        for r in read_results(store, "generated_tests", day, GeneratedTestRow)
    )
    docs = sum(
        r.reviewer_refusals or 0
        for day in days
        for r in read_results(store, "generated_docs", day, GeneratedDocRow)
    )
    return {"analysis": analysis, "tests": tests, "docs": docs}


def coverage_by_day(
    metadata: dict[str, dict[str, dict[str, Any]]], days: Sequence[str]
) -> list[dict[str, Any]]:
    """generated_tests' coverage figures after each day."""
    keys = ("symbols", "symbols_with_accepted_test", "test_coverage", "candidates", "accepted")
    return [{"day": d, **{k: metadata[d]["generated_tests"].get(k) for k in keys}} for d in days]


def run(settings: Settings) -> dict[str, Any]:
    with empty_data_dir(settings.data_dir) as root, _sigterm_unwinds():
        fresh = load_settings(settings.config_dir)
        server = build_server(fresh, "cpu", port=0, publish=False)
        try:
            server.start()
            days = sample_days()
            store, metadata = _materialize(fresh, server.url, root, days)
            tests, rows = tests_yield(store, days)
            kinds = {
                "analysis": analysis_yield(store, days),
                "tests": tests,
                "refactor": refactor_yield(store, days),
                "docs": docs_yield(store, days),
            }
            dataset = dataset_rows(metadata, days)
            caught = reviewer_refusals(store, days)
        finally:
            server.stop()
    out = report(kinds, dataset, coverage_by_day(metadata, days), rows, days, caught)
    # Issue 11's targets on real code nobody here wrote: a PyPI package's releases, one a day.
    package = real_package.run(settings)
    out["real_package"] = package
    out["targets"] |= {
        "real_package_no_module_left_out_for_size": {
            "value": package["left_out_for_size"],
            "met": not package["left_out_for_size"],
        },
        "real_package_full_coverage_within_its_days": {
            "value": package["days_to_full_coverage"],
            "target": len(package["days"]),
            "met": package["days_to_full_coverage"] is not None,
        },
    }
    out["markdown"] += "\n\n" + package["markdown"]
    return out


def report(
    kinds: dict[str, KindYield],
    rows: dict[str, int],
    per_day: list[dict[str, Any]],
    tests: Sequence[GeneratedTestRow],
    days: Sequence[str],
    caught: dict[str, int] | None = None,
) -> dict[str, Any]:
    total = rows["train"] + rows["eval"]
    asked = kinds["tests"].asked
    share = kinds["tests"].targets_with_accepted / asked if asked else 0.0
    targets = {
        "dataset_rows": {
            "value": total,
            "target": TARGET_DATASET_ROWS,
            "met": total >= TARGET_DATASET_ROWS,
            "gap": max(0, TARGET_DATASET_ROWS - total),
        },
        "tests_targets_with_accepted_share": {
            "value": round(share, 4),
            "target": TARGET_TESTS_SHARE,
            "met": share >= TARGET_TESTS_SHARE,
        },
    }
    out: dict[str, Any] = {name: kinds[name].model_dump(exclude_none=True) for name in KINDS}
    for name, count in (caught or {}).items():
        out[name]["reviewer_refusals_caught"] = count
    out |= {
        "dataset_rows": total,
        "dataset_split": rows,
        "days": list(days),
        "tests_per_day": per_day,
        "tests_accepted": [
            {"symbol": f"{r.path}::{r.symbol}", "test": r.code} for r in tests if r.accepted and r.code
        ],
        "targets": targets,
    }
    out["markdown"] = markdown(out)
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"CPU-lane yield on the sample repository, days {', '.join(out['days'])} (embedded model):",
        "",
        "| kind | asked | sampled | accepted | reviewer refusals caught | targets with accepted | pass@1 "
        "| pass@n | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in KINDS:
        k = out[name]
        lines.append(
            f"| {name} | {k['asked']} | {k['sampled']} | {k['accepted']} "
            f"| {k.get('reviewer_refusals_caught', 'no such check')} | {k['targets_with_accepted']} "
            f"| {k['pass_at_1']:.1%} | {k['pass_at_n']:.1%} | {k.get('note', '')} |"
        )
    targets = out["targets"]
    rows, share = targets["dataset_rows"], targets["tests_targets_with_accepted_share"]
    lines += [
        "",
        f"Dataset rows (train + eval): {out['dataset_rows']} ({out['dataset_split']['train']} + "
        f"{out['dataset_split']['eval']}); target >= {rows['target']}: "
        + ("met" if rows["met"] else f"MISSED by {rows['gap']}"),
        f"tests: targets with an accepted test / asked = {share['value']:.1%}; target >= "
        f"{share['target']:.0%}: " + ("met" if share["met"] else "MISSED"),
    ]
    return "\n".join(lines)
