#!/usr/bin/env bash
# Set up everything needed, then start JupyterLab with the sandboxed kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --ip=127.0.0.1 --no-browser "${extra[@]}" "$@"
