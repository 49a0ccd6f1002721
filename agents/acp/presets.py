"""The outside agents keel knows how to run through ACP: their npm package, command, model API and setup.

Each preset turns (the unit's home folder, keel's model proxy URL, the unit's proxy token) into the
agent's environment and configuration files. The environment is built from an allowlist, never from
keel's own: the agent sees the proxy URL and its token, never a provider key, and each agent is told to
keep those from the commands it runs itself (Claude Code's CLAUDE_CODE_SUBPROCESS_ENV_SCRUB, Gemini CLI's
environmentVariableRedaction; Codex reads its token from its config file). Versions are pinned to what
keel is tested with (docs/acp-agents.md). Depends on the standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from keel.protocol.agent import ForwardApi

# KEEL_UNIT_RUN: the unit run's tag, by which keel finds every process of the run (server/engine/units/runtree.py)
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "TMPDIR", "SYSTEMROOT", "KEEL_UNIT_RUN")
# what the agent is given to reach keel's proxy: never passed on to the commands it runs itself
PROXY_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "KEEL_PROXY_TOKEN")
OFFLINE_ENV = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "NO_COLOR": "1"}


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    package: str  # npm name@version
    binary: str  # its executable in node_modules/.bin
    args: tuple[str, ...]
    api: ForwardApi
    fs_write: bool = False  # advertise fs.writeTextFile: the agent writes files through keel
    # False: a run after a crash starts a new session with the goal and the journal instead of loading the
    # old one (docs/acp-agents.md says why, per agent)
    loads_sessions: bool = True
    # the agent's own effectful tools that keel's (write_file, apply_diff, run; agents/acp/mcp.py) replace
    keel_tools: tuple[str, ...] = ()
    env_vars: dict[str, str] = field(default_factory=dict)
    # a Node agent that would start a second Node process of itself for a heap of half the machine's memory
    # (Gemini CLI's launcher, which its env_vars turn off): keel starts it once, with that heap
    sized_heap: bool = False

    def command(self, executable: str) -> list[str]:
        """How the bridge starts the agent installed at `executable`."""
        if not self.sized_heap:
            return [executable, *self.args]
        node = shutil.which("node") or "node"
        half_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**21
        return [node, f"--max-old-space-size={half_mb}", executable, *self.args]

    @property
    def install(self) -> str:
        return f"npm install --prefix {default_agents_dir()} {self.package}"

    def environment(self, home: Path, proxy_url: str, token: str) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(OFFLINE_ENV)
        env.update(self.env_vars)
        env["HOME"] = str(home)
        env["XDG_CONFIG_HOME"] = str(home / ".config")
        if self.api == "anthropic":
            env.update(
                ANTHROPIC_BASE_URL=proxy_url,
                ANTHROPIC_API_KEY=token,
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                CLAUDE_CODE_SUBPROCESS_ENV_SCRUB="1",  # what Claude Code starts itself gets no ANTHROPIC_API_KEY
            )
            if os.geteuid() == 0:  # Claude Code refuses to run its tools unasked as root unless told exactly this
                env["IS_SANDBOX"] = "1"
        elif self.api == "gemini":
            env.update(GOOGLE_GEMINI_BASE_URL=proxy_url, GEMINI_API_KEY=token)
        else:
            env.update(CODEX_HOME=str(home / "codex"))  # the token is in its config file, not in the environment
        return env

    def prepare(self, home: Path, proxy_url: str, token: str = "") -> None:
        """Write the agent's own configuration under `home` (again on every run: the proxy port changes);
        Codex reads the unit's token from it, so that no command it runs finds the token in its environment."""
        home.mkdir(parents=True, exist_ok=True)
        if self.api == "gemini":
            settings = home / ".gemini" / "settings.json"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_text(
                json.dumps(
                    {
                        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                        "privacy": {"usageStatisticsEnabled": False},
                        "telemetry": {"enabled": False},
                        "security": {
                            "auth": {"selectedType": "gemini-api-key"},
                            # its shell commands get neither the unit's token nor the proxy's address
                            "environmentVariableRedaction": {"enabled": True, "blocked": list(PROXY_ENV)},
                        },
                    },
                    indent=2,
                )
            )
        elif self.api == "openai-responses":
            codex = home / "codex"
            codex.mkdir(parents=True, exist_ok=True)
            (codex / "config.toml").write_text(
                'model = "keel"\n'
                'model_provider = "keel"\n'
                'approval_policy = "untrusted"\n'  # every patch and command asks: keel records each as an intent
                'sandbox_mode = "danger-full-access"\n'  # keel's sandbox is the unit's own folder
                "check_for_update_on_startup = false\n"
                "[analytics]\nenabled = false\n"
                # its shell commands get none of the proxy's names (the token is not in its environment at all)
                "[shell_environment_policy]\n"
                'inherit = "all"\n'
                f"exclude = {json.dumps(list(PROXY_ENV))}\n"
                "[model_providers.keel]\n"
                'name = "keel"\n'
                f'base_url = "{proxy_url}/v1"\n'
                'wire_api = "responses"\n'
                f"experimental_bearer_token = {json.dumps(token)}\n"
                "requires_openai_auth = false\n"
                "supports_websockets = false\n"
            )


PRESETS: dict[str, Preset] = {
    "claude": Preset(
        "claude",
        "Claude Code",
        "@zed-industries/claude-agent-acp@0.23.1",
        "claude-agent-acp",
        (),
        "anthropic",
        keel_tools=("Edit", "MultiEdit", "Write", "NotebookEdit", "Bash"),
    ),
    # Gemini CLI 0.61's session/load first starts a recording for the session id, whose opening record
    # replaces the history in the very file it then reads: "No previous sessions found", or an empty history
    "gemini": Preset(
        "gemini",
        "Gemini CLI",
        "@google/gemini-cli@0.61.0",
        "gemini",
        ("--acp",),
        "gemini",
        fs_write=True,
        loads_sessions=False,
        sized_heap=True,
        env_vars={"GEMINI_CLI_NO_RELAUNCH": "true"},
    ),
    "codex": Preset("codex", "Codex", "@zed-industries/codex-acp@0.16.0", "codex-acp", (), "openai-responses"),
}


def default_agents_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "keel" / "agents"


def search_path() -> list[Path]:
    """Where agent executables are looked for: $KEEL_ACP_AGENTS (an npm prefix or its .bin), keel's own
    agents folder, then PATH."""
    dirs: list[Path] = []
    if extra := os.environ.get("KEEL_ACP_AGENTS"):
        for part in extra.split(os.pathsep):
            dirs += [Path(part) / "node_modules" / ".bin", Path(part)]
    dirs.append(default_agents_dir() / "node_modules" / ".bin")
    return dirs


def find(preset: Preset) -> str | None:
    """The full path of the preset's executable, or None when it is not installed."""
    for folder in search_path():
        candidate = folder / preset.binary
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(preset.binary)
