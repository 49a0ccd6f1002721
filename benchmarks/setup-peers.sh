#!/usr/bin/env bash
# Make the peers' venv for benchmarks/steps.py --peers: LangGraph (+ SQLite checkpointer) and DBOS.
# Kept apart from the project's .venv: keel never depends on them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-peers
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "langgraph>=1.0" "langgraph-checkpoint-sqlite>=3.0" "dbos>=2.0"
echo "peers venv ready: $VENV/bin/python"
