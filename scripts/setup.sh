#!/usr/bin/env bash
# Idempotent set-up of a development/test machine (Debian/Ubuntu).
#   scripts/setup.sh          what JupyterLab with the sandboxed kernel needs
#   scripts/setup.sh --test   also what the test suite needs (Docker, Chromium)
# System packages are installed with apt-get when run as root; otherwise the
# missing package is named and the script stops.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

apt_updated=0
need_pkg() {  # need_pkg COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "setup: '$1' is missing: install the package '$2' (e.g. sudo apt-get install $2)" >&2
        exit 1
    fi
    if [ "$apt_updated" = 0 ]; then
        echo "setup: apt-get update" >&2
        apt-get update -qq
        apt_updated=1
    fi
    echo "setup: installing $2" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

need_file() {  # need_file GLOB PACKAGE: for packages whose programs are not on PATH
    compgen -G "$1" >/dev/null && return 0
    need_pkg "__missing_$2" "$2"
}

need_pkg bwrap bubblewrap
need_pkg pasta passt
need_pkg node nodejs
need_pkg npm npm
if [ "$want_test" = 1 ]; then
    need_pkg chromium chromium
    need_pkg dockerd docker.io
    need_file "/usr/lib/postgresql/*/bin/initdb" postgresql  # the shared ratchet store's tests
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$python" -m venv .venv
fi
stamp=.venv/.sandbox-kernel-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ -n "$(find labextension/src labextension/package.json -newer "$stamp" 2>/dev/null | head -1)" ]; then
    echo "setup: installing sandbox_kernel (editable) into .venv" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,lab,docker]" 2>&1 | grep -v '^WARNING: Location' || true
    .venv/bin/python -c "import sandbox_kernel" || { echo "setup: pip install failed" >&2; exit 1; }
    touch "$stamp"
fi
if [ "$want_test" = 1 ] && [ ! -x .venv/chp/node_modules/.bin/configurable-http-proxy ]; then
    # JupyterHub's proxy, for the hub deployment test (its own folder: not a workspace of package.json)
    echo "setup: installing configurable-http-proxy (npm) into .venv/chp" >&2
    mkdir -p .venv/chp
    [ -f .venv/chp/package.json ] || echo '{"name": "sandbox-kernel-test-chp", "private": true}' > .venv/chp/package.json
    (cd .venv/chp && npm install --silent --no-audit --no-fund configurable-http-proxy@5) \
        || { echo "setup: npm install configurable-http-proxy failed" >&2; exit 1; }
fi
.venv/bin/python -I -m sandbox_kernel install --sys-prefix >/dev/null
echo "setup: ready (kernelspec sandbox-python installed in .venv)" >&2
