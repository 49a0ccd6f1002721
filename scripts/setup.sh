#!/usr/bin/env bash
# Create (or refresh) the project's environment: .venv with keel installed editable (its folders linked from
# .venv/keel-src/keel) plus dev tools.
# Usage: scripts/setup.sh [--system]   (--system installs the Debian packages the tests use instead, as root;
# scripts/test.sh runs both side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

system_packages() {
  local need=()
  for pkg in neovim vim emacs-nox elpa-eglot dbus gnome-keyring libsecret-tools chromium libkrb5-dev postgresql iproute2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if ((${#need[@]})); then
    echo "setup: installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

if [[ "${1:-}" == "--system" ]]; then
  system_packages
  exit 0
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.keel-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp || constraints.txt -nt $stamp ]]; then
  log=.venv/setup.log
  if ! { .venv/bin/python -m pip install -q --upgrade pip setuptools wheel &&
         .venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"; } >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -n 40 >&2
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  .venv/bin/python -c "import keel.server.cli" && touch "$stamp"
fi
# keel's folders on the import path as an installed package's are: a folder `keel` of links to them, named by a
# plain path line in a .pth file. The editable install's own hook (a finder that its .pth imports, and pathlib, re,
# fnmatch and importlib.util with it) cost every Python start in the venv about 10 ms; a keel process, which imports
# much of that anyway, a few ms (benchmarks/startup.py).
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
mkdir -p .venv/keel-src/keel
for p in protocol storage server agents; do ln -sfn "$ROOT/$p" ".venv/keel-src/keel/$p"; done
echo "$ROOT/.venv/keel-src" > "$site/keel-src.pth"
rm -f "$site"/__editable__.keel_runtime-*.pth
# Bytecode for keel's own folders, as an installed package has it: the editable install leaves the sources
# uncompiled, and with PYTHONDONTWRITEBYTECODE (or a read-only checkout) every keel process compiled them
# again at start (a host, its workers and agents: tens of ms each). A later run recompiles what changed since.
.venv/bin/python -m compileall -q protocol storage server agents >/dev/null
echo "setup: environment ready at $ROOT/.venv"
