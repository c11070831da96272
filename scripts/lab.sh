#!/usr/bin/env bash
# Set up everything needed, then start JupyterLab with the sandboxed kernel as
# the only Python kernel (configuration: scripts/lab_config.py).
#   scripts/lab.sh [--with-stock-kernel] [jupyter lab arguments...]
# --with-stock-kernel (or SANDBOX_KERNEL_STOCK_KERNEL=1) also offers ipykernel's
# unsandboxed "Python 3 (ipykernel)"; its notebooks are marked "Not sandboxed".
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
    if [ "$arg" = --with-stock-kernel ]; then
        export SANDBOX_KERNEL_STOCK_KERNEL=1
    else
        args+=("$arg")
    fi
done
bash scripts/setup.sh
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --config="$PWD/scripts/lab_config.py" --ip=127.0.0.1 --no-browser \
    "${extra[@]}" ${args[@]+"${args[@]}"}
