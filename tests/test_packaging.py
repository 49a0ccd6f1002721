"""Packaging: the wheel installs keel.protocol/storage/server/agents and nothing under generic names.

The wheel is built from a copy of the sources (so the worktree gets no build/ or egg-info) and installed
into a fresh venv made without --system-site-packages: the project's .venv holds keel as an editable
install, which would hide a broken wheel. keel's third-party dependencies are reused from the project's
environment through a path entry in a .pth file; that adds the folder to sys.path but does not run the
.pth files inside it, so the project's own keel (.venv/keel-src/keel, scripts/setup.sh) stays out (the test checks
where keel.* resolves).
No network is used.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "storage", "server", "agents")

CHECK = """
import importlib, sys
from pathlib import Path
import keel, keel.protocol, keel.storage, keel.server, keel.agents, keel.server.cli, keel.storage.verify
site_dir = Path(sys.argv[1]).resolve()
assert [Path(p).resolve() for p in keel.__path__] == [site_dir / "keel"], keel.__path__
for name in ("protocol", "storage", "server", "agents"):
    module = importlib.import_module("keel." + name)
    assert Path(module.__file__).resolve().is_relative_to(site_dir), module.__file__
    assert (site_dir / "keel" / name / "py.typed").exists()
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError(f"generic top-level module {name!r} is importable")
print("ok")
"""


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_installs_only_keel_packages_and_the_console_script(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        src,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob(
        "keel_runtime-*.whl"
    )  # the distribution is keel-runtime (`keel` on PyPI is taken)
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("keel/", "keel_runtime-0.1.0.dist-info/")) for n in names), names
    assert "keel/__init__.py" not in names  # keel is a namespace package over its four subpackages

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    site_dir = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip()
    )
    outer = Path(sysconfig.get_paths()["purelib"])
    assert outer in map(Path, site.getsitepackages())
    (site_dir / "_keel_test_deps.pth").write_text(f"{outer}\n")

    assert _run(python, "-c", CHECK, site_dir, cwd=tmp_path).stdout.strip() == "ok"
    help_text = _run(venv / "bin" / "keel", "--help", cwd=tmp_path).stdout
    assert help_text.startswith("usage: keel") and "verify" in help_text


def test_editable_install_resolves_to_the_repository_folders(tmp_path: Path) -> None:
    code = (
        "import keel.protocol, keel.storage, keel.server, keel.agents as a; "
        "print('\\n'.join(m.__file__ for m in (keel.protocol, keel.storage, keel.server, a)))"
    )
    files = _run(sys.executable, "-c", code, cwd=tmp_path).stdout.split()  # through .venv/keel-src/keel's links
    assert [Path(f).resolve() for f in files] == [ROOT / name / "__init__.py" for name in PACKAGES]
