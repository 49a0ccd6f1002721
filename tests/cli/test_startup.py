"""The command line imports only what the verb it runs needs: `keel --help` loads no verb module, and a
read verb loads neither the providers' HTTP client and keyring nor the language server. The figures are in
benchmarks/startup.py; these tests guard the imports that made them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from keel.server.commands import VERBS

HEAVY = ("httpx", "keyring", "pygls", "lsprotocol", "lmdb", "msgspec", "asyncio", "keel.server.engine.host")

PROBE = """
import json, sys
from keel.server.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def imported(*argv: str, cwd: Path) -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


def test_help_lists_every_verb_and_imports_no_verb_module(tmp_path: Path) -> None:
    code, modules = imported("--help", cwd=tmp_path)
    assert code == 0
    assert not [m for m in HEAVY if m in modules]
    assert not [m for m in modules if m.startswith("keel.server.commands.")]
    out = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for verb, about in VERBS.items():
        assert verb in out and about.help.split()[0] in out


def test_missions_reads_the_store_without_providers_or_the_language_server(tmp_path: Path) -> None:
    code, modules = imported("missions", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert code == 0
    assert {"httpx", "keyring", "pygls", "lsprotocol", "keel.server.engine.host"}.isdisjoint(modules)
    assert {m for m in modules if m.startswith("keel.server.commands.")} == {
        "keel.server.commands.missions",
        "keel.server.commands.common",
    }
    assert not [m for m in modules if m.startswith("keel.server.engine")]


def test_every_verb_parses_its_own_arguments(tmp_path: Path) -> None:
    """Each verb's parser is built from its module when named: its --help names its own options."""
    for verb in VERBS:
        proc = subprocess.run(
            [sys.executable, "-m", "keel.server.cli", verb, "--help"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, (verb, proc.stderr)
        assert f"usage: keel {verb}" in proc.stdout and "--store" in proc.stdout, verb
