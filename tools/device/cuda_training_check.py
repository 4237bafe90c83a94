"""GPU-machine check of the project's PEFT LoRA trainer (`python -m lanes_pipeline.gpu_lane.training`).

Prepare here (`tools/device/prepare.sh`: the wheels the trainer needs and the image lacks, and the
converted model's config and tokenizer, into the git-ignored `.device/`), then on the GPU machine, from
the repository root, with `.device` carried:  python3 tools/device/cuda_training_check.py OUT_DIR

1. bootstrap: the wheels in .device/wheels whose distribution the running python lacks (or, for
   UPGRADE_IF_OLDER, has in an older version) are unpacked into a scratch site folder, which goes first on
   sys.path and PYTHONPATH (with the repository root): nothing the image already has is shadowed.
2. a random-weight model with the architecture and tokenizer in .device/model (config.json + tokenizer
   files of the converted SmolLM2-135M-Instruct): a mechanics and speed check, not a quality check.
3. a small lora_dataset day (the project's contract: make_row / save_rows / partition_dir).
4. the trainer as the project starts it (runner.start_trainer -> launch.trainer_argv), on cuda, on cpu
   (a few steps, for a tokens/s comparison), a bigger packed cuda run, and the eval mode on cuda.
5. OUT_DIR/result.json (rewritten after every phase, so a kill still leaves one), a log per trainer run,
   the loss curve of the cuda run; a short summary on stdout.

Environment knobs (for a local test): CHECK_CPU_ONLY=1 (skip every cuda phase), CHECK_CPU_STEPS (5),
CHECK_CUDA_STEPS (30), CHECK_TINY_MODEL=N (keep N decoder layers), CHECK_BUDGET_S (450, for all phases),
CHECK_RUN_TIMEOUT_S (240, per trainer process), CHECK_NO_BOOTSTRAP=1 (use the running python's packages),
CHECK_BIG_STEPS (20, the packed batch-16 cuda run), CHECK_CUDA_AS_CPU=1 (run the cuda phases on the CPU: a
local test of their plumbing only).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".device" / "wheels"
MODEL_SRC = REPO / ".device" / "model"
SCRATCH = Path(tempfile.gettempdir()) / "lanes-device-check"
# the folder name matters: dill (datasets fingerprints with it) pickles modules by value, and fails on
# pyarrow, unless their __file__ is under sys.prefix or contains "site-packages" (unsloth PR #9791)
SITE = SCRATCH / "site-packages"
UPGRADE_IF_OLDER = {"typing-extensions"}  # pydantic 2.14 needs >= 4.16; newer is safe for torch & co.
IMAGE_PACKAGES = [
    "torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "numpy", "pandas", "pyarrow",
    "fsspec", "huggingface-hub", "matplotlib", "typing-extensions", "xxhash", "pyyaml", "click", "filelock",
    "packaging", "tqdm", "datasets", "pydantic", "dagster", "dill", "multiprocess",
]  # fmt: skip
T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("CHECK_BUDGET_S", "450"))
RUN_TIMEOUT_S = float(os.environ.get("CHECK_RUN_TIMEOUT_S", "240"))
CPU_ONLY = os.environ.get("CHECK_CPU_ONLY") == "1"

RESULT: dict[str, Any] = {"errors": [], "python": sys.version.split()[0], "platform": platform.platform()}
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else SCRATCH / "out")


def write_result() -> None:
    RESULT["elapsed_s"] = round(time.perf_counter() - T0, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(RESULT, indent=1, default=str) + "\n")


def error(where: str, exc: BaseException | str) -> None:
    text = exc if isinstance(exc, str) else "".join(traceback.format_exception(exc))[-4000:]
    RESULT["errors"].append({"where": where, "error": text})
    print(f"[check] ERROR in {where}: {text}", flush=True)
    write_result()


def remaining() -> float:
    return BUDGET_S - (time.perf_counter() - T0)


def say(message: str) -> None:
    print(f"[check {time.perf_counter() - T0:6.1f}s] {message}", flush=True)


# -- 1. bootstrap ------------------------------------------------------------------------------------------


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def older(a: str, b: str) -> bool:
    try:
        from packaging.version import Version

        return Version(a) < Version(b)
    except Exception:
        nums = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:4])  # noqa: E731
        return nums(a) < nums(b)


def unpack_wheel(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    for data in site.glob("*.data"):
        for kind in ("purelib", "platlib"):
            inner = data / kind
            if inner.is_dir():
                for child in inner.iterdir():
                    target = site / child.name
                    if target.exists():
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                    shutil.move(str(child), str(target))
        shutil.rmtree(data)


def bootstrap() -> None:
    sys.path[:] = [p for p in sys.path if not p.startswith(str(SITE))]
    image = {name: image_version(name) for name in IMAGE_PACKAGES}
    RESULT["image_versions"] = image
    installed, skipped = [], []
    if os.environ.get("CHECK_NO_BOOTSTRAP") == "1":
        RESULT["bootstrap"] = "skipped (CHECK_NO_BOOTSTRAP)"
    else:
        shutil.rmtree(SITE, ignore_errors=True)
        SITE.mkdir(parents=True)
        for wheel in sorted(WHEELS.glob("*.whl")):
            dist, version = wheel.name.split("-")[:2]
            have = image_version(canonical(dist))
            if have is None or (canonical(dist) in UPGRADE_IF_OLDER and older(have, version)):
                unpack_wheel(wheel, SITE)
                installed.append(f"{dist}=={version}" + (f" (image had {have})" if have else ""))
            else:
                skipped.append(f"{dist} (image has {have}, carried {version})")
        RESULT["bootstrap"] = {"installed": installed, "skipped_image_has": skipped, "site": str(SITE)}
    front = ([str(SITE)] if installed else []) + [str(REPO)]
    sys.path[:0] = front
    parts = list(front)
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    # nothing can be fetched there: fail fast instead of waiting for a network
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    os.environ.setdefault("HF_HOME", str(SCRATCH / "hf-home"))
    os.environ.setdefault("MPLCONFIGDIR", str(SCRATCH / "mpl"))
    import importlib

    importlib.invalidate_caches()
    say(f"bootstrap: installed {len(installed)} wheel(s): {', '.join(installed) or '-'}")


# -- 2. the model ----------------------------------------------------------------------------------------


def torch_facts() -> None:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        facts.update(
            device_name=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            bf16_supported=torch.cuda.is_bf16_supported(),
            device_count=torch.cuda.device_count(),
            cuda_runtime=torch.version.cuda,
        )
    facts["cpu_threads"] = torch.get_num_threads()
    facts["os_cpu_count"] = os.cpu_count()
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,memory.used",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        facts["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["nvidia_smi"] = f"unavailable: {exc}"
    RESULT["torch"] = facts
    write_result()


def build_model(target: Path) -> Path:
    """The architecture of .device/model with random weights, saved like the converted model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(MODEL_SRC, target)
    config = AutoConfig.from_pretrained(str(MODEL_SRC))
    tiny = os.environ.get("CHECK_TINY_MODEL")
    if tiny:
        config.num_hidden_layers = int(tiny)
        for key in ("layer_types",):
            if isinstance(getattr(config, key, None), list):
                setattr(config, key, getattr(config, key)[: int(tiny)])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    saved_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved_dtype, str):
        saved_dtype = getattr(torch, saved_dtype, None)
    if isinstance(saved_dtype, torch.dtype):
        model = model.to(saved_dtype)
    model.save_pretrained(str(target))
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_SRC))  # as the trainer will load it
    RESULT["model"] = {
        "dir": str(target),
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "saved_dtype": str(next(model.parameters()).dtype),
        "files": sorted(p.name for p in target.iterdir()),
        "tokenizer": type(tokenizer).__name__,
        "tokenizer_is_fast": bool(tokenizer.is_fast),
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "build_s": round(time.perf_counter() - started, 1),
    }
    write_result()
    del model
    return target


# -- 3. the dataset --------------------------------------------------------------------------------------

WORDS = [
    "the",
    "function",
    "returns",
    "a",
    "list",
    "of",
    "values",
    "read",
    "from",
    "the",
    "file",
    "and",
    "checks",
    "each",
    "one",
    "against",
    "the",
    "schema",
    "before",
    "it",
    "is",
    "written",
    "to",
    "the",
    "cache",
    "so",
    "that",
    "a",
    "later",
    "call",
    "can",
    "reuse",
    "it",
    "without",
    "parsing",
    "again",
    "while",
    "errors",
    "are",
    "collected",
    "and",
    "reported",
    "together",
    "with",
    "the",
    "line",
    "number",
    "of",
    "every",
    "bad",
    "record",
]


def synthetic(index: int, rng: Any) -> tuple[str, str]:
    name = f"load_records_{index}"
    body = "\n".join(f"    value_{j} = parse(line_{j}, schema)" for j in range(rng.randint(2, 8)))
    question = (
        f"Explain what `{name}` does:\n```python\ndef {name}(path, schema):\n{body}\n    return values\n```"
    )
    answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 90))).capitalize() + "."
    return question, answer


def write_dataset(root: Path) -> Path:
    import random

    from lanes_pipeline.dataset.contract import make_row
    from lanes_pipeline.dataset.window import partition_dir
    from lanes_pipeline.dataset.writer import save_rows
    from lanes_pipeline_tests.gpu_lane.fixtures import EVAL_QUESTIONS, TRAIN_QUESTIONS, chat, codename_rows

    rng = random.Random(0)
    train = codename_rows(TRAIN_QUESTIONS)
    train += [make_row(chat(*synthetic(i, rng)), task="explain") for i in range(56)]
    eval_rows = codename_rows(EVAL_QUESTIONS)
    eval_rows += [make_row(chat(*synthetic(1000 + i, rng)), task="explain") for i in range(6)]
    shutil.rmtree(root, ignore_errors=True)
    folder = save_rows(partition_dir(root, date(2026, 1, 1)), train, eval_rows)
    RESULT["dataset"] = {"dir": str(folder), "train_rows": len(train), "eval_rows": len(eval_rows)}
    write_result()
    return folder


# -- 4. the trainer ----------------------------------------------------------------------------------------


def run_trainer(label: str, command: str, spec: Any, training: Any) -> dict[str, Any]:
    """The trainer process as the project starts it (runner.start_trainer: trainer_argv + trainer_env),
    with a deadline; its JSON-line events parsed as runner._run_printing does."""
    from lanes_pipeline.gpu_lane.training.launch import trainer_argv
    from lanes_pipeline.gpu_lane.training.runner import _parse, start_trainer, stop

    timeout = min(RUN_TIMEOUT_S, remaining() - 10)
    record: dict[str, Any] = {"label": label, "command": command, "timeout_s": round(timeout, 1)}
    RESULT.setdefault("runs", {})[label] = record
    if timeout < 30:
        record["skipped"] = f"only {timeout:.0f} s of the check's budget left"
        write_result()
        return record
    spec_path = SCRATCH / f"spec-{label}.json"
    spec_path.write_text(spec.model_dump_json(indent=1))
    log_path = OUT / (f"{label}.log" if label.startswith(command) else f"{command}_{label}.log")
    log_path.unlink(missing_ok=True)
    record["argv"] = trainer_argv(command, spec_path, training, cpus=os.cpu_count() or 1)
    say(f"{label}: {' '.join(record['argv'])}")
    events: list[dict[str, Any]] = []
    lines: list[str] = []
    started = time.perf_counter()
    process = start_trainer(command, spec_path, log_path, training=training)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            event = _parse(line)
            if event is not None:
                events.append(event)
                if event.get("event") == "step" and (event["step"] in (1, 2) or event["step"] % 10 == 0):
                    say(f"{label}: step {event['step']}/{event['total_steps']} loss {event['loss']:.4f} "
                        f"{event['tokens_per_s']:.0f} tok/s")  # fmt: skip
                elif event.get("event") in ("start", "eval"):
                    say(f"{label}: {json.dumps(event)[:400]}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        record["timed_out"] = True
        stop(process)
        code = process.returncode
    finally:
        if process.poll() is None:
            stop(process)
    reader.join(timeout=10)
    record["returncode"] = code
    record["process_wall_s"] = round(time.perf_counter() - started, 2)
    with log_path.open("a") as log:  # the stdout events after the stderr, for one file per run
        log.write("\n----- stdout (JSON lines) -----\n" + "".join(lines))
    starts = [e for e in events if e.get("event") == "start"]
    if starts:
        record["start"] = {k: v for k, v in starts[-1].items() if k != "event"}
    steps = [e for e in events if e.get("event") == "step"]
    if steps:
        record["step_tokens_per_s"] = [steps[0]["tokens_per_s"], steps[-1]["tokens_per_s"]]
        record["first_step_elapsed_s"] = steps[0]["elapsed_s"]
        if len(steps) >= 4:  # the summary's tokens_per_s counts the first (warm-up) steps in; this does not
            first = steps[len(steps) // 4]
            span = steps[-1]["elapsed_s"] - first["elapsed_s"]
            if span > 0:
                record["steady_tokens_per_s"] = round((steps[-1]["tokens"] - first["tokens"]) / span, 1)
                record["steady_from_step"] = first["step"]
    done = [e for e in events if e.get("event") == "done"]
    if done:
        summary = done[-1]["summary"]
        curve = summary.get("loss_curve") or []
        record["summary"] = {
            key: summary.get(key)
            for key in (
                "device", "dtype", "steps", "samples", "dropped_samples", "sequences", "tokens",
                "trained_tokens", "padded_tokens", "tokens_per_s", "train_s", "wall_s", "peak_rss_mb",
                "peak_accelerator_mb", "final_loss", "packing", "processes",
            )
        }  # fmt: skip
        record["summary"]["first_loss"] = curve[0][1] if curve else None
        record["summary"]["last_loss"] = curve[-1][1] if curve else None
        record["loss_curve"] = curve
        adapter = Path(done[-1]["path"])
        record["adapter_dir"] = str(adapter)
        if adapter.is_dir():
            record["adapter_files"] = {p.name: p.stat().st_size for p in sorted(adapter.iterdir())}
    evals = [e for e in events if e.get("event") == "eval"]
    if evals:
        record["eval"] = {k: v for k, v in evals[-1].items() if k != "event"}
    if code != 0 or (command == "train" and not done) or (command == "eval" and not evals):
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.is_file() else ""
        error(label, f"trainer {command} exited {code}{' (timed out)' if record.get('timed_out') else ''}; "
              f"log tail:\n{tail}")  # fmt: skip
    write_result()
    return record


def check_adapter(label: str, record: dict[str, Any], base: Path) -> None:
    """What the lora_adapter asset checks after training: vLLM could load this folder."""
    if "adapter_dir" not in record:
        return
    try:
        from lanes_pipeline.gpu_lane.adapters import check_adapter_dir, supported_target_modules
        from lanes_pipeline.settings import GpuLane

        check_adapter_dir(
            Path(record["adapter_dir"]), GpuLane().max_lora_rank, supported_target_modules(base)
        )
        record["vllm_compatible"] = True
    except Exception as exc:
        record["vllm_compatible"] = False
        error(f"{label}: check_adapter_dir", exc)
    write_result()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    write_result()
    try:
        bootstrap()
    except Exception as exc:
        error("bootstrap", exc)
    write_result()
    try:
        import lanes_pipeline.gpu_lane.training.trainer  # noqa: F401  (what the trainer process imports)
        from lanes_pipeline.gpu_lane.training.spec import EvalSpec, TrainSpec
        from lanes_pipeline.settings import LoraSettings, TrainingConfig

        RESULT["trainer_import"] = "ok"
    except Exception as exc:
        RESULT["trainer_import"] = "failed"
        error("import lanes_pipeline.gpu_lane.training.trainer", exc)
        return 1
    try:
        torch_facts()
        say(f"torch: {json.dumps(RESULT['torch'])}")
    except Exception as exc:
        error("torch", exc)
        return 1
    try:
        base = build_model(SCRATCH / "base-model")
        say(f"model: {json.dumps(RESULT['model'])}")
        day = write_dataset(SCRATCH / "artifacts")
    except Exception as exc:
        error("model/dataset", exc)
        return 1
    adapters = SCRATCH / "adapters"
    shutil.rmtree(adapters, ignore_errors=True)
    lora = LoraSettings(r=8, alpha=16, dropout=0.0)

    fake_cuda = os.environ.get("CHECK_CUDA_AS_CPU") == "1"  # local test of the cuda phases' plumbing

    def training(device: str, steps: int, **changes: Any) -> Any:
        device = "cpu" if fake_cuda else device
        fields = dict(base_model_dir=str(base), device=device, max_steps=steps, batch_size=4, max_seq_len=256,
                      learning_rate=2e-3, lora=lora, warmup_steps=0)  # fmt: skip
        return TrainingConfig(**{**fields, **changes})

    def train_spec(config: Any, name: str) -> Any:
        # as the lora_adapter asset builds it (gpu_lane/assets.py _train_day)
        return TrainSpec(training=config, base_model_dir=str(base), dataset_dirs=[str(day)],
                         output_dir=str(adapters / name))  # fmt: skip

    cuda_ok = (bool(RESULT["torch"].get("cuda_available")) or fake_cuda) and not CPU_ONLY
    if not cuda_ok and not CPU_ONLY:
        error("cuda", "torch sees no CUDA device: the cuda phases are skipped")
    cuda_steps = int(os.environ.get("CHECK_CUDA_STEPS", "30"))
    cpu_steps = int(os.environ.get("CHECK_CPU_STEPS", "5"))
    phases: list[tuple[str, str, Any]] = []
    if cuda_ok:
        config = training("cuda", cuda_steps)
        phases.append(("cuda", "train", (train_spec(config, "cuda"), config)))
    config = training("cpu", cpu_steps)
    phases.append(("cpu", "train", (train_spec(config, "cpu"), config)))
    if cuda_ok:
        eval_config = training("cuda", cuda_steps)
        phases.append(("eval_cuda", "eval", (eval_config, {"adapter_cuda": str(adapters / "cuda")})))
        big_steps = int(os.environ.get("CHECK_BIG_STEPS", "20"))
        config = training("cuda", big_steps, batch_size=16, max_seq_len=512, packing=True)
        phases.append(("cuda_b16_packed", "train", (train_spec(config, "cuda_b16_packed"), config)))
    else:
        eval_config = training("cpu", cpu_steps)
        phases.append(("eval_cpu", "eval", (eval_config, {"adapter_cpu": str(adapters / "cpu")})))
    for label, command, payload in phases:
        try:
            if command == "eval":
                config, named = payload
                named = {k: v for k, v in named.items() if Path(v).is_dir()}
                spec = EvalSpec(
                    training=config, base_model_dir=str(base), dataset_dirs=[str(day)], adapters=named
                )
                run_trainer(label, "eval", spec, config)
            else:
                spec, config = payload
                record = run_trainer(label, "train", spec, config)
                check_adapter(label, record, base)
                curve_png = adapters / label / "loss_curve.png"
                if label == "cuda" and curve_png.is_file():
                    shutil.copy(curve_png, OUT / "loss_curve_cuda.png")
        except Exception as exc:
            error(label, exc)
    return 0


def summary() -> None:
    torch_info = RESULT.get("torch", {})
    print("\n===== summary =====", flush=True)
    print(
        f"python {RESULT['python']}  torch {torch_info.get('torch')}  "
        f"cuda {torch_info.get('cuda_available')}  {torch_info.get('device_name', '')}  "
        f"trainer import: {RESULT.get('trainer_import')}"
    )
    for label, run in RESULT.get("runs", {}).items():
        if "summary" in run:
            s = run["summary"]
            print(
                f"{label:>16}: {s['device']} {s['dtype']} steps {s['steps']} loss {s['first_loss']} -> "
                f"{s['last_loss']}  {s['tokens_per_s']} tok/s (steady {run.get('steady_tokens_per_s')})  "
                f"train {s['train_s']} s  process {run['process_wall_s']} s  "
                f"peak acc MB {s['peak_accelerator_mb']}  rss MB {s['peak_rss_mb']}  "
                f"vllm-ok {run.get('vllm_compatible')}"
            )
        elif "eval" in run:
            print(f"{label:>16}: eval {json.dumps(run['eval'])}  process {run['process_wall_s']} s")
        else:
            print(f"{label:>16}: no result (rc {run.get('returncode')}, {run.get('skipped', '')})")
    print(f"errors: {len(RESULT['errors'])}" + "".join(f"\n  - {e['where']}: {e['error'][-300:]}"
                                                     for e in RESULT["errors"]))  # fmt: skip
    print(f"elapsed {time.perf_counter() - T0:.1f} s; result: {OUT / 'result.json'}", flush=True)


if __name__ == "__main__":
    status = 1
    try:
        status = main()
    except BaseException as exc:
        error("main", exc)
    finally:
        write_result()
        summary()
    sys.exit(0 if status == 0 and not RESULT["errors"] else 1)
