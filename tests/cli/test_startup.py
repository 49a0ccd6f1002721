"""The command line imports only what the verb it runs needs: `keel --help` loads no verb module, and a
read verb loads neither the providers' HTTP client and keyring nor the language server. The figures are in
benchmarks/startup.py; these tests guard the imports that made them."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from keel.server.cli import build_parser
from keel.server.commands import VERBS
from keel.storage import Store

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


def test_missions_loads_nothing_only_help_errors_or_debugging_need(tmp_path: Path) -> None:
    """Listing an existing store's missions: no shutil (argparse's width lookup), no traceback (--debug), no
    dataclasses (the LMDB file checks), no OpenSSL (hashlib; records need only BLAKE2b), no
    typing_extensions nor the inspect module it pulls in (msgspec takes what keel's records need from
    typing)."""
    Store.open(tmp_path / "store").close()
    code, modules = imported("missions", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert code == 0 and "keel.storage.store" in modules
    assert {"shutil", "traceback", "dataclasses", "_hashlib", "typing_extensions", "inspect"}.isdisjoint(modules)


def test_a_verb_that_needs_typing_extensions_imports_it_after_msgspec(tmp_path: Path) -> None:
    """msgspec is imported without typing_extensions, never in its place: a library a verb loads later (pygls,
    for `keel serve`) imports it as usual."""
    probe = "from keel.protocol.lean import import_msgspec; import_msgspec(); import typing_extensions, msgspec"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv", [["missions", "extra"], ["missions", "--bogus"], ["status", "a", "b"]])
def test_a_verb_first_command_line_errs_as_the_full_parser_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Started with its verb, the command line is parsed without the other verbs' placeholders: what the top
    level prints then is what the parser listing every verb prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    full = build_parser(["-", *argv])  # not verb first: every verb is listed
    with pytest.raises(SystemExit) as exit_:
        full.parse_args(argv)
    assert (proc.returncode, proc.stderr) == (exit_.value.code, capsys.readouterr().err)
    assert "unrecognized arguments" in proc.stderr


@pytest.mark.parametrize("columns", ["60", "200", "", "wide", "-3"])
def test_help_is_as_wide_as_argparse_makes_it(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    for argv in ([], ["run"]):
        parser = build_parser(argv)
        ours = parser.format_help()
        parser.formatter_class = argparse.HelpFormatter  # which asks shutil.get_terminal_size
        assert parser.format_help() == ours


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
