#!/usr/bin/env bash
# Install the outside ACP agents keel's tests drive into .tools/acp-agents (idempotent; ~20 s the first time):
#   @zed-industries/claude-agent-acp (Claude Code), @google/gemini-cli, @zed-industries/codex-acp
# at the versions keel.agents.acp.presets pins, with the system's Node.js (20+). Prints KEEL_ACP_AGENTS=<dir>
# (tests/acp reads it). An agent that cannot be installed is reported and left out; the tests of that agent
# then skip with the reason. Usage: scripts/acp-agents.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=$PWD/.tools/acp-agents
mkdir -p "$DIR"
[[ -f $DIR/package.json ]] || echo '{"private": true}' >"$DIR/package.json"
log() { echo "acp-agents: $*" >&2; }
packages=$(.venv/bin/python -c 'from keel.agents.acp.presets import PRESETS; print(" ".join(p.package for p in PRESETS.values()))')
stamp=$DIR/.installed-$(echo "$packages" | tr ' @/' '_-_' | md5sum | cut -c1-12)
if [[ ! -f $stamp ]]; then
  if ! command -v npm >/dev/null; then
    log "npm not found: install Node.js 20+ (Debian: apt-get install nodejs npm)"
  else
    log "installing $packages"
    for pkg in $packages; do
      (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "$pkg" >/dev/null 2>"$DIR/npm-$(basename "${pkg%@*}").log") \
        || log "could not install $pkg (see $DIR/npm-$(basename "${pkg%@*}").log)"
    done
    touch "$stamp"
  fi
fi
echo "KEEL_ACP_AGENTS=$DIR"
