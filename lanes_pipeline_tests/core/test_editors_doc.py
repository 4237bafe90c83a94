"""docs/editors.md gives an editor the GPU lane as the configs make it: the base URL of the embedded vLLM's
port, the alias's model name (`<adapter_prefix>-<alias>`), the base model's name, and the API-key setting;
every snippet on the page (Aider's command and config file, Continue's config, curl, Python) names those
values, so a change of a default that the page does not follow fails here."""

from __future__ import annotations

import re

import yaml

from lanes_pipeline.settings import GpuLane, project_root

ROOT = project_root()
DOC = ROOT / "docs" / "editors.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(DOC.read_text(encoding="utf-8")) if lang == language]


def defaults() -> tuple[str, str, str]:
    """(base URL, alias model name, base model name) of the shipped defaults."""
    lane = GpuLane()
    return f"http://127.0.0.1:{lane.embedded.port}/v1", lane.alias_name, lane.served_model_name


def test_the_page_states_the_configs_base_url_model_and_key_setting() -> None:
    url, alias, base = defaults()
    text = DOC.read_text(encoding="utf-8")
    assert f"| base URL | `{url}` |" in text
    assert f"| model | `{alias}` |" in text
    assert f"as `{base}`" in text
    for setting in (
        "gpu_lane.api_key_env",
        "gpu_lane.embedded.port",
        "gpu_lane.adapter_prefix",
        "gpu_lane.alias",
    ):
        assert setting in text
    assert f"max_model_len` tokens ({GpuLane().embedded.max_model_len})" in text


def test_the_aider_snippets_name_the_alias_and_the_url() -> None:
    url, alias, _ = defaults()
    [command] = [b for b in blocks("bash") if "aider" in b]
    assert f"--openai-api-base {url}" in command and f"--model openai/{alias}" in command
    [config] = [yaml.safe_load(b) for b in blocks("yaml") if "openai-api-base" in b]
    assert config["openai-api-base"] == url and config["model"] == f"openai/{alias}"


def test_the_continue_config_is_yaml_that_names_the_alias_and_the_url() -> None:
    url, alias, _ = defaults()
    [config] = [yaml.safe_load(b) for b in blocks("yaml") if "schema: v1" in b]
    [model] = config["models"]
    assert model["model"] == alias and model["apiBase"] == url and model["provider"] == "vllm"
    assert "autocomplete" in model["roles"] and "chat" in model["roles"]


def test_curl_asks_both_endpoints_of_the_alias() -> None:
    url, alias, _ = defaults()
    [curl] = [b for b in blocks("bash") if "curl" in b]
    assert f"{url}/chat/completions" in curl and f"{url}/completions " in curl
    assert curl.count(f'"model": "{alias}"') == 2


def test_the_python_snippet_compiles_and_names_the_alias_and_the_url() -> None:
    url, alias, _ = defaults()
    [python] = blocks("python")
    compile(python, str(DOC), "exec")
    assert f'base_url="{url}"' in python and f'model="{alias}"' in python


def test_the_readme_points_at_the_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "[docs/editors.md](docs/editors.md)" in readme
