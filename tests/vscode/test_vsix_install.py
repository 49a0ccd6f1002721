"""The VSIX carries keel: its wheel and the script Install keel runs, which makes keel's own environment
with a Python 3.11+ found on the machine (no keel installed anywhere before) and installs the wheel there;
keel's dependencies come from pip's configured index (here the machine's local one, no network)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def test_the_vsix_installs_keel_into_its_own_environment(vsix: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(vsix) as package:
        carried = [n for n in package.namelist() if n.startswith("extension/client-vscode/bundled/")]
        package.extractall(tmp_path / "vsix", members=carried)
    bundled = tmp_path / "vsix" / "extension" / "client-vscode" / "bundled"
    assert sorted(p.name for p in bundled.iterdir()) == ["install.py", "keel_runtime-0.1.0-py3-none-any.whl"]

    base = Path(sys.base_prefix) / "bin" / "python3"  # a Python without keel: not this test's .venv
    probe = subprocess.run([base, "-c", "import keel.server"], capture_output=True, check=False)
    assert probe.returncode != 0, "the base interpreter has keel already: the test would prove nothing"
    env = tmp_path / "global storage" / "python-env"  # the extension's storage path may hold spaces
    done = subprocess.run([base, bundled / "install.py", env], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == str(env / "bin" / "python")
    version = subprocess.run([env / "bin" / "keel", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "keel 0.1.0"
    where = subprocess.run(
        [env / "bin" / "python", "-c", "import keel.server; print(keel.server.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(env)  # the wheel's copy, not a checkout


def test_install_says_what_is_wrong_with_an_old_python(tmp_path: Path) -> None:
    """The script runs under whatever Python it is given; under one older than 3.11 it says so and stops
    (here: the version check itself, with the version made to look old)."""
    script = Path(__file__).resolve().parents[2] / "client-vscode" / "bundled" / "install.py"
    code = (
        "import sys, runpy; sys.version_info = (3, 9, 18, 'final', 0); sys.argv = ['install.py', sys.argv[1]]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code, tmp_path / "env"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "keel needs Python 3.11 or newer" in done.stderr and "3.9.18" in done.stderr
    assert not (tmp_path / "env").exists()
