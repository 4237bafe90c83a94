"""Collect real CPU-lane analyses for the labelled fixture the explanation checks are measured on.

The embedded CPU lane (llama-server, the configured model) analyses the most referenced symbols (`--per-repo`)
of the sample repository and of real packages nobody here wrote, exactly as `repo_analysis` does on a day
(its asset, its prompts, its grammar). Each analysis is written with its symbol and the checks' verdict,
unlabelled: a person labels each one `sound` (says what the symbol does, nothing false) or `nonsense`,
with a short why, and adds them to lanes_pipeline/cpu_lane/jobs/analysis_labels.json (whose entries have
this shape: `analysis_checks.LabelledAnalysis`).

    .venv/bin/python tools/collect_analyses.py /tmp/collected.json

Refuses to overwrite an existing file (labels are work). A few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path

import yaml
from dagster import DagsterInstance, load_assets_from_modules, materialize

from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.bench.real_package import build_release_repo
from lanes_pipeline.cpu_lane.assets import repo_analysis, repo_snapshot
from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.jobs.rows import AnalysisRow
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.repos.location import repo_location
from lanes_pipeline.repos.sample_repo import HISTORY
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.settings import edit_config_file, load_settings

# Pure-Python packages with their tests in the sdist, none of them in the anchor set.
PACKAGES = (
    ("tabulate", "0.9.0", ["test/**", "setup.py", "benchmark.py"]),
    ("decorator", "5.1.1", ["tests/**"]),
)


def _configs(root: Path, day: date, per_repo: int) -> Path:
    configs = root / "configs"
    shutil.copytree(load_settings().config_dir, configs)
    entries = yaml.safe_load((configs / "repos.yaml").read_text(encoding="utf-8"))["repos"]
    for package, version, exclude in PACKAGES:
        built = build_release_repo(root / "repos" / package, root / "downloads", day, package, (version,))
        entries.append(
            {
                "name": package,
                "path": str(built.path),
                "branch": "main",
                "include": ["**/*.py"],
                "exclude": exclude,
            }
        )
    (configs / "repos.yaml").write_text(yaml.safe_dump({"repos": entries}), encoding="utf-8")
    # the day's backlog: the most referenced symbols of each repository first
    edit_config_file(configs / "pipeline.yaml", {"cpu_assets": {"backlog_per_day": per_repo}})
    return configs


def collect(target: Path, per_repo: int) -> int:
    day = HISTORY[-1][0].date()  # the sample's last day: all its symbols exist
    with (
        tempfile.TemporaryDirectory(prefix="lanes-analyses-") as folder,
        empty_data_dir(load_settings().data_dir),
    ):
        settings = load_settings(_configs(Path(folder), day, per_repo))
        server = build_server(settings, "cpu", port=0, publish=False)
        server.start()
        try:
            root = Path(folder) / "artifacts"
            resources = {
                "cpu_lane": CpuLaneResource.from_lanes(settings.lanes, base_url=server.url),
                "artifact_store": ArtifactStoreResource(root=str(root)),
                "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
            }
            assets = partitioned_daily(
                load_assets_from_modules([repo_snapshot, repo_analysis]),
                daily_partitions(settings),  # type: ignore[arg-type]
            )
            result = materialize(
                assets,
                resources=resources,
                partition_key=day.isoformat(),
                instance=DagsterInstance.ephemeral(),
            )
            if not result.success:
                raise RuntimeError("collect_analyses: repo_analysis failed")
            store = ArtifactStoreResource(root=str(root)).store()
            rows = []
            for repo in read_results(store, "repo_analysis", day.isoformat(), AnalysisRow):
                entry = next(e for e in settings.repos.repos if e.name == repo.repo)
                if repo.commit is None:
                    continue
                paths = {item.path for item in repo.files}
                at = symbols_at(repo_location(settings, entry), repo.commit, paths)
                by_name = {(s.path, s.name): s for s in at.symbols}
                for item in repo.files:
                    symbol = by_name.get((item.path, item.symbol or ""))
                    if item.analysis is None or symbol is None:
                        continue
                    rows.append(
                        {
                            "id": f"{repo.repo}:{item.path}::{item.symbol}",
                            "symbol": symbol.model_dump(mode="json"),
                            "analysis": item.analysis.model_dump(),
                            "gate_accepted": item.accepted,
                            "gate_reason": item.reason,
                            "label": None,
                            "why": "",
                        }
                    )
        finally:
            server.stop()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--per-repo", type=int, default=25, help="symbols per repository (most referenced)")
    args = parser.parse_args()
    if args.target.exists():
        sys.exit(f"{args.target} exists: it may hold labels; write elsewhere")
    print(f"{collect(args.target, args.per_repo)} analyses written to {args.target}")


if __name__ == "__main__":
    main()
