#!/usr/bin/env bash
# Set up everything needed, then start JupyterLab with the sandboxed kernel as
# the only Python kernel (configuration: scripts/lab_config.py).
#   scripts/lab.sh [--with-stock-kernel] [jupyter lab arguments...]
# --with-stock-kernel (or SANDBOX_KERNEL_STOCK_KERNEL=1) also offers ipykernel's
# unsandboxed "Python 3 (ipykernel)"; its notebooks are marked "Not sandboxed".
set -euo pipefail
start_dir=$PWD
cd "$(dirname "$0")/.."
repo=$PWD
args=()
root_given=0
for arg in "$@"; do
    if [ "$arg" = --with-stock-kernel ]; then
        export SANDBOX_KERNEL_STOCK_KERNEL=1
    elif [[ "$arg" == --ServerApp.jpserver_extensions* ]]; then
        # on the command line it replaces the whole list, with the server
        # extensions that guard what sandboxes wrote (docs/security.md)
        echo "lab: $arg would drop the sandbox's server extensions; add an extension in a config file instead:" >&2
        echo "     c.ServerApp.jpserver_extensions['name'] = True  (jupyter lab --config=FILE, or ~/.jupyter)" >&2
        exit 2
    else
        case "$arg" in --notebook-dir*|--ServerApp.root_dir*|--root-dir*) root_given=1 ;; esac
        args+=("$arg")
    fi
done
# Notebooks never live in this repository: a notebook's folder is its sandbox's
# read-write workspace, and the repository holds code the host runs (these
# scripts, the venv, the package). Lab opens on the folder the command was run
# from, or ~/notebooks when that is the repository itself.
if [ "$root_given" = 0 ]; then
    root_dir=$start_dir
    case "$start_dir/" in "$repo"/*) root_dir=${SANDBOX_KERNEL_NOTEBOOKS:-$HOME/notebooks} ;; esac
    mkdir -p "$root_dir"
    echo "lab: notebooks folder: $root_dir" >&2
    args=(--ServerApp.root_dir="$root_dir" ${args[@]+"${args[@]}"})
fi
bash scripts/setup.sh
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --config="$PWD/scripts/lab_config.py" --ip=127.0.0.1 --no-browser \
    "${extra[@]}" ${args[@]+"${args[@]}"}
