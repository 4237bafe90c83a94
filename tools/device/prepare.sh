#!/usr/bin/env bash
# What tools/device/cuda_training_check.py needs on a GPU machine that has its own Python 3.12 with torch,
# transformers and peft but no registry: the wheels of the trainer's other imports (cp312, the versions in
# .venv) and the converted SmolLM2's config and tokenizer (the check makes random weights from them).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.device/' .git/info/exclude || echo '/.device/' >> .git/info/exclude
mkdir -p .device/wheels .device/model
packages="dagster dagster-shared dagster-pipes pydantic pydantic-core annotated-types typing-inspection
  coloredlogs humanfriendly docstring-parser toposort pytz datasets dill multiprocess typing-extensions
  tomli platformdirs tomlkit python-dotenv structlog tzdata universal-pathlib"
pins=$(for p in $packages; do echo "$p==$(.venv/bin/pip show "$p" | sed -n 's/^Version: //p')"; done)
# shellcheck disable=SC2086
.venv/bin/pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --no-deps -d .device/wheels $pins
model=$(.venv/bin/python -c 'from lanes_pipeline.embedded import engines; from lanes_pipeline.settings import data_dir; print(engines.embedded_hf_model(data_dir()))')
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$model/$f" ] && cp "$model/$f" .device/model/
done
du -sh .device
