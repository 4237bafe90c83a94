"""Reading a config file and turning what pydantic found wrong into issues that name file, key and reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lanes_pipeline.config.base import ConfigIssue


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _reason(error: Any) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind in {
        "int_parsing",
        "int_type",
        "float_parsing",
        "float_type",
        "bool_parsing",
        "bool_type",
        "string_type",
        "list_type",
        "date_from_datetime_parsing",
        "date_parsing",
        "model_type",
        "int_from_float",
        "dict_type",
    }:
        return f"{value!r} is not valid: {_lower_first(error['msg'])}"
    if kind == "literal_error":
        return f"{value!r} is not one of {error['ctx']['expected'].replace(chr(39), '')}"
    return f"{value!r}: {_lower_first(error['msg'])}"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def file_issues(file: str, exc: ValidationError) -> list[ConfigIssue]:
    issues = []
    for error in exc.errors():
        # Model validators report at the model's own location; pydantic marks nothing else on the loc.
        loc = tuple(part for part in error["loc"] if part != "__root__")
        issues.append(ConfigIssue(file, _key_path(loc), _reason(error)))
    return issues


def read_yaml(path: Path, label: str) -> tuple[dict[str, Any] | None, list[ConfigIssue]]:
    if not path.exists():
        return None, [ConfigIssue(label, "", "file not found")]
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return None, [ConfigIssue(label, "", f"invalid YAML: {where}{problem}")]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return None, [ConfigIssue(label, "", f"top level must be a mapping, got {type(raw).__name__}")]
    return raw, []


def path_label(path: Path) -> str:
    """Paths in messages as the user would type them: relative to the working folder when possible."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
