#!/usr/bin/env bash
# Set up everything the tests need (bubblewrap, Docker daemon, Chromium, the
# venv), run the static checks (scripts/lint.sh; SKIP_LINT=1 skips them while
# iterating), then the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ -f scripts/ensure-docker.sh ]; then
    bash scripts/ensure-docker.sh || echo "test: no Docker daemon could be started" >&2
fi
if [ "${SKIP_LINT:-0}" != 1 ]; then
    bash scripts/lint.sh
fi
# Two workers, each taking whole files (a module's Lab server or Docker image
# is made once): most of the suite waits on kernels, browsers and daemons.
exec .venv/bin/python -m pytest -n "${SANDBOX_TEST_WORKERS:-2}" --dist loadfile "$@"
