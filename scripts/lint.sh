#!/usr/bin/env bash
# Static checks (run by scripts/test.sh before the tests; a finding fails the run):
# ruff lint + format and mypy (strict) on the Python, eslint + prettier on the
# JupyterLab extension. Configuration: pyproject.toml, labextension/package.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "lint: ruff" >&2
ruff check sandbox_kernel tests bench scripts
ruff format --check --quiet sandbox_kernel tests bench scripts
echo "lint: mypy" >&2
mypy
echo "lint: eslint + prettier (labextension)" >&2
cd labextension
if [ ! -x node_modules/.bin/eslint ]; then
    jlpm install >/dev/null
fi
jlpm lint:check >/dev/null || { jlpm lint:check; exit 1; }
echo "lint: clean" >&2
