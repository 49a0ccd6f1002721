#!/usr/bin/env bash
# Set everything up and run every check: ruff, mypy, pytest (unit, engine, chaos, editors).
set -euo pipefail
cd "$(dirname "$0")/.."
# what installs from the network runs side by side with what needs the CPU: the Debian packages and then
# the editor tools (code-server's native modules build against libkrb5-dev) beside pip, ruff and mypy; the
# ACP agents (their versions are read from keel) once the venv is there
echo "== Debian packages and editor tools (installing in the background)"
( bash scripts/setup.sh --system && bash scripts/editor-tools.sh >/dev/null ) & tools=$!
bash scripts/setup.sh
source .venv/bin/activate
echo "== acp agents (installing in the background)"
bash scripts/acp-agents.sh >/dev/null & agents=$!
echo "== ruff"; ruff check .; ruff format --check .  # two commands: a failure in an && list does not end the script
echo "== mypy"; mkdir -p .venv/mypy-path/keel && for p in protocol storage server agents; do ln -sfn "$PWD/$p" .venv/mypy-path/keel/$p; done; MYPYPATH=.venv/mypy-path mypy -p keel
wait "$tools" || { echo "test: installing the Debian packages or the editor tools failed" >&2; exit 1; }
wait "$agents" || { echo "test: installing the ACP agents failed" >&2; exit 1; }
# two workers per core (KEEL_TEST_WORKERS overrides): most of a test's time is spent waiting for the
# processes it starts, so one worker per core leaves the cores half idle; three per core was slower. Tests
# that share something beyond their own store, port and tmp folder run on one worker (their xdist_group,
# tests/conftest.py). The CPU line counts the processes pytest waited for, not the detached hosts and the
# editors the tests start.
TIMEFORMAT="== pytest took %R s wall, %U s user and %S s system CPU"
echo "== pytest (from $(date +%T))"; time python -m pytest -q -p no:cacheprovider -n "${KEEL_TEST_WORKERS:-$(( $(nproc) * 2 ))}" --dist loadgroup --durations=25 "$@"
