"""Each setting is written once: its default lives in the pydantic model, and a shipped file in configs/
sets a key only where it differs from that default. The rest of a shipped file is the same settings
commented out at their defaults (`#key: value`), for the reader; uncommented, they must be the defaults."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter

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
