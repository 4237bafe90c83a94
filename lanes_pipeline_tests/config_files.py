"""Tests change a copy of the shipped configs. A shipped file sets only what differs from the models'
defaults, so the section a test changes may be absent: `read_config` gives nested dicts that appear where a
test writes into them, and `write_config` writes plain YAML back."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml


class ConfigTree(defaultdict[str, Any]):
    """A mapping whose missing keys are new, empty ConfigTrees (a section the file leaves at its defaults)."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        super().__init__(ConfigTree)
        for key, value in (values or {}).items():
            self[key] = ConfigTree(value) if isinstance(value, dict) else value


def read_config(path: Path) -> ConfigTree:
    return ConfigTree(yaml.safe_load(path.read_text(encoding="utf-8")) or {})


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def write_config(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(plain(data), sort_keys=False), encoding="utf-8")
