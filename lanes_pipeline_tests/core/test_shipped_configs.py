"""Each setting is written once: its default lives in the pydantic model, and a shipped file in configs/
sets a key only where it differs from that default. The rest of a shipped file is the same settings
commented out at their defaults (`#key: value`), for the reader; uncommented, they must be the defaults. And
no model or dataclass outside config/ declares a config setting's default again."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticUndefined

import lanes_pipeline
from lanes_pipeline.config.base import StrictModel
from lanes_pipeline.settings import CONFIG_MODELS as MODELS
from lanes_pipeline.settings import project_root

SHIPPED = project_root() / "configs"


def restated_defaults(model: type[BaseModel], data: dict[str, Any], where: str) -> list[str]:
    """Every key in `data` whose value equals the model's default for it."""
    found = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        path = f"{where}{key}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
            found += restated_defaults(annotation, value, f"{path}.")
        elif not field.is_required():
            default = field.get_default(call_default_factory=True)
            if TypeAdapter(annotation).validate_python(value) == default:
                found.append(f"{path}: {value!r}")
    return found


def uncommented(text: str) -> str:
    """The settings commented out at their defaults, as YAML: `#key: ...` and `#  key: ...` lose their `#`;
    prose (`# ...`) stays a comment."""
    lines = []
    for line in text.splitlines():
        is_setting = line.startswith("#") and (line[1:2] not in ("", " ", "#") or line.startswith("#  "))
        lines.append(line[1:] if is_setting else line)
    return "\n".join(lines)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_shipped_file_sets_only_what_differs_from_the_default(name: str) -> None:
    data = yaml.safe_load((SHIPPED / name).read_text()) or {}
    assert restated_defaults(MODELS[name], data, f"{name}: ") == []


@pytest.mark.parametrize("name", ["lanes.yaml", "training.yaml", "pipeline.yaml"])
def test_the_settings_commented_out_in_a_shipped_file_are_the_defaults(name: str) -> None:
    model = MODELS[name]
    text = (SHIPPED / name).read_text()
    documented = yaml.safe_load(uncommented(text))
    assert documented, f"{name} documents no setting"
    assert model.model_validate(documented) == model.model_validate(yaml.safe_load(text) or {})


def test_a_restated_default_is_found_also_in_a_nested_section() -> None:
    lanes = {"gpu_lane": {"alias": "current", "max_loras": 3, "embedded": {"port": 8000}}}
    assert restated_defaults(MODELS["lanes.yaml"], lanes, "") == [
        "gpu_lane.alias: 'current'",
        "gpu_lane.embedded.port: 8000",
    ]
    assert (
        uncommented("# prose\n#cpu_lane:\n#  max_slots: 2   # why\n")
        == "# prose\ncpu_lane:\n  max_slots: 2   # why"
    )


# Same name, same default, a different setting: a request's sampling seed is not the trainer's seed.
NOT_A_CONFIG_SETTING = {
    ("BatchRequest", "seed"),
    ("ChatRequest", "seed"),
    ("CompletionRequest", "seed"),
    ("MoeSpec", "seed"),  # the seed of an upcycled model's noise and router
}


def defaults_of(cls: type) -> Iterator[tuple[str, Any]]:
    """A pydantic model's or a dataclass's fields with a default, except None and a config model (a
    resource holding a config section defaults to that section, declared once in config/)."""
    if issubclass(cls, BaseModel):
        pairs = [(name, field.default) for name, field in cls.model_fields.items()]
    elif dataclasses.is_dataclass(cls):
        pairs = [(field.name, field.default) for field in dataclasses.fields(cls)]
    else:
        return
    for name, default in pairs:
        if default in (PydanticUndefined, dataclasses.MISSING, None) or isinstance(default, StrictModel):
            continue
        yield name, default


def classes(package: str) -> Iterator[type]:
    """Every class defined in `package`'s modules."""
    module = importlib.import_module(package)
    modules = [module]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if not info.name.endswith("__main__") and ".sample_repo" not in info.name:
                modules.append(importlib.import_module(info.name))
    for each in modules:
        yield from (c for c in vars(each).values() if isinstance(c, type) and c.__module__ == each.__name__)


def redeclared_defaults(config_package: str, code_packages: list[str]) -> list[str]:
    """`module.Class.field = default` for each field outside the config package whose name and default are
    a config setting's (a second declaration that drifts from the first)."""
    settings: dict[str, list[Any]] = {}
    for cls in classes(config_package):
        for name, default in defaults_of(cls):
            settings.setdefault(name, []).append(default)
    found = []
    for package in code_packages:
        for cls in classes(package):
            if cls.__module__.startswith(config_package):
                continue
            for name, default in defaults_of(cls):
                if (cls.__name__, name) in NOT_A_CONFIG_SETTING:
                    continue
                if any(type(d) is type(default) and d == default for d in settings.get(name, [])):
                    found.append(f"{cls.__module__}.{cls.__name__}.{name} = {default!r}")
    return found


def test_no_class_outside_config_declares_a_config_default_again() -> None:
    assert redeclared_defaults("lanes_pipeline.config", [lanes_pipeline.__name__]) == []


def test_a_redeclared_default_is_found() -> None:
    found = redeclared_defaults("lanes_pipeline.config", ["lanes_pipeline_tests.core.redeclared_default"])
    assert found == ["lanes_pipeline_tests.core.redeclared_default.OldBatchConfig.max_slots = 2"]
