"""Install keel into the extension's own environment: `python install.py ENV_DIR`.

The VS Code extension runs this (Install keel) with the Python it found; it carries keel's wheel next to
this file (built by `npm run package`). The environment is a venv at ENV_DIR (under the extension's
global storage), so nothing is installed into the user's interpreters. keel's dependencies come from the
package index pip is configured with (PyPI, or a mirror / PIP_INDEX_URL / PIP_FIND_LINKS): several of
them ship compiled code per platform and Python version, which one .vsix cannot carry for every machine.
In a checkout of keel without a built wheel (a development build) keel is installed from the checkout.
Prints the environment's Python on its last line. Standard library only; runs on Python 3.8+ far enough
to say that keel needs 3.11.
"""

import subprocess
import sys
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEEDED = (3, 11)


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: install.py ENV_DIR", file=sys.stderr)
        return 2
    if sys.version_info < NEEDED:
        found = ".".join(map(str, sys.version_info[:3]))
        print(f"keel needs Python 3.11 or newer; {sys.executable} is {found}: choose another interpreter", file=sys.stderr)
        return 1
    source = what_to_install()
    if source is None:
        print(f"this build of the extension carries no keel wheel (nothing in {HERE})", file=sys.stderr)
        return 1
    env = Path(argv[1])
    python = env_python(env)
    if not python.exists():
        print(f"creating keel's environment in {env}", flush=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=env.exists()).create(env)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"cannot create a virtual environment in {env}: {exc} (on Debian/Ubuntu: apt install python3-venv)",
                  file=sys.stderr)
            return 1
    print(f"installing {source}", flush=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--upgrade", str(source)]
    if subprocess.run(pip).returncode != 0:
        print("pip could not install keel and its dependencies (above: what failed); if this machine cannot reach "
              "PyPI, point pip at a mirror (PIP_INDEX_URL) or a folder of wheels (PIP_FIND_LINKS)", file=sys.stderr)
        return 1
    check = subprocess.run([str(python), "-m", "keel.server.cli", "--version"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"keel was installed but does not start: {check.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"{check.stdout.strip()} is installed")
    print(python)
    return 0


def what_to_install():
    """The newest wheel carried next to this file, else the checkout this file is in (a development build)."""
    wheels = sorted(HERE.glob("keel_runtime-*.whl"), key=lambda p: p.stat().st_mtime)
    if wheels:
        return wheels[-1]
    checkout = HERE.parents[1]
    if (checkout / "pyproject.toml").exists() and (checkout / "server" / "cli.py").exists():
        return checkout
    return None


def env_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
