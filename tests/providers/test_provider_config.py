"""Provider configuration files: merging user and workspace files, and errors naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.server.providers import ProviderConfigError, load_provider_config

EXAMPLE = """
[network]
connect_timeout_s = 3.0
max_attempts = 5

[[providers]]
name = "openai"
kind = "openai-compatible"
model = "gpt-4o"
api_key_env = "OPENAI_API_KEY"
[providers.capabilities]
tools = true
context_window = 128000
vision = true
[providers.cost]
input_per_mtok = 2.5
output_per_mtok = 10.0
[[providers.endpoints]]
url = "https://api.openai.com/v1"

[[providers]]
name = "ollama"
kind = "openai-compatible"
model = "qwen2.5-coder:7b"
[providers.capabilities]
tools = true
context_window = 32768
local = true
[[providers.endpoints]]
url = "http://127.0.0.1:11434/v1"
name = "laptop"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_and_workspace_files_merge(tmp_path: Path) -> None:
    user = write(tmp_path / "home" / "keel" / "config.toml", EXAMPLE)
    write(
        tmp_path / "ws" / ".keel" / "config.toml",
        """
[network]
max_attempts = 2
[[providers]]
name = "ollama"
kind = "openai-compatible"
model = "llama3.1:8b"
endpoints = [{url = "http://127.0.0.1:8080/v1"}]
[mission]
name = "other parts of keel may use other tables"
""",
    )
    cfg = load_provider_config(tmp_path / "ws", user)
    assert [p.name for p in cfg.providers] == ["openai", "ollama"]
    assert cfg.provider("ollama").model == "llama3.1:8b"  # type: ignore[union-attr]
    assert cfg.provider("openai").capabilities.context_window == 128000  # type: ignore[union-attr]
    assert (cfg.network.connect_timeout_s, cfg.network.max_attempts) == (3.0, 2)
    assert len(cfg.sources) == 2


def test_xdg_config_home_is_the_default_user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "xdg" / "keel" / "config.toml", EXAMPLE)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cfg = load_provider_config(tmp_path / "empty-ws")
    assert cfg.provider("ollama").endpoint_id(0) == "laptop"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (
            ('kind = "openai-compatible"\nmodel = "gpt-4o"', 'kind = "openai"\nmodel = "gpt-4o"'),
            r":8: providers\[0\]\.kind: Invalid enum value 'openai' "
            r"\(use 'openai-compatible', 'anthropic' or 'gemini'\)",
        ),
        (("context_window = 128000", 'context_window = "big"'), r"providers\[0\]\.capabilities\.context_window"),
        (("vision = true", "vision = true\ncolour = true"), r"providers\[0\]\.capabilities\.colour: unknown key"),
        (
            ('url = "https://api.openai.com/v1"', 'url = "api.openai.com"'),
            r"providers\[0\]\.endpoints\[0\]\.url: 'api.openai.com' is not an http",
        ),
        (('name = "ollama"', 'name = "openai"'), r":\d+: providers\[1\]\.name: duplicate provider name 'openai'"),
        (("max_attempts = 5", "max_attempts = 0"), r":4: network\.max_attempts: must be positive"),
        (("connect_timeout_s = 3.0", "connect_timout_s = 3.0"), r"network\.connect_timout_s: unknown key"),
        (('model = "gpt-4o"\n', ""), r"providers\[0\]\.model: required key is missing"),
        (('name = "ollama"\n', 'name = "ollama"\nendpoints = []\n'), r"providers\[1\]\.endpoints: at least one"),
        (("[network]", "[network"), r"TOML syntax error"),
    ],
)
def test_bad_configuration_names_file_line_and_key(tmp_path: Path, mutation: tuple[str, str], expected: str) -> None:
    old, new = mutation
    assert old in EXAMPLE
    text = EXAMPLE.replace(old, new, 1)
    if "endpoints = []" in new:
        text = text.rsplit("[[providers.endpoints]]", 1)[0]
    path = write(tmp_path / "ws" / ".keel" / "config.toml", text)
    with pytest.raises(ProviderConfigError, match=expected) as raised:
        load_provider_config(tmp_path / "ws", tmp_path / "no-user-file.toml")
    assert raised.value.message.startswith(str(path))


def test_providers_as_a_single_table_is_explained(tmp_path: Path) -> None:
    write(tmp_path / "ws" / ".keel" / "config.toml", "[providers]\nname = 'x'\n")
    with pytest.raises(ProviderConfigError, match=r"config.toml:1: providers: write each provider as an \[\[provi"):
        load_provider_config(tmp_path / "ws", tmp_path / "none.toml")
