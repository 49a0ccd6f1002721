#!/usr/bin/env bash
# Set everything up and run the demo mission.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/keel demo "$@"
