#!/usr/bin/env bash
# Create or refresh the project virtualenv in .venv.
#
# Idempotent: the install is skipped while a stamp matching the sha256 of pyproject.toml
# and constraints.txt exists in .venv. Needs Python 3.11 (and Java 17 for the Spark tests)
# on the machine. Override the interpreter with PYTHON=/path/to/python3.11.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PYTHON=${PYTHON:-python3.11}

# Two concurrent pip runs in one virtualenv corrupt it; serialise bootstraps.
mkdir -p "$VENV"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV/.bootstrap.lock"
    flock 9
fi

if [[ ! -x $VENV/bin/python ]]; then
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        echo "bootstrap: '$PYTHON' not found; install Python 3.11 or set PYTHON=" >&2
        exit 1
    fi
    echo "bootstrap: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

digest=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
stamp="$VENV/.bootstrap-$digest"
if [[ -f $stamp ]]; then
    exit 0
fi

echo "bootstrap: installing airflow-seatunnel-ckpt[test] into $VENV (pyproject.toml or constraints.txt changed)"
"$VENV/bin/python" -m pip install --quiet --progress-bar off \
    --constraint constraints.txt --editable '.[test]'

if ! command -v java >/dev/null 2>&1 && [[ -z ${JAVA_HOME:-} ]]; then
    echo "bootstrap: warning: no java on PATH and JAVA_HOME unset; Spark tests need Java 17" >&2
fi

rm -f "$VENV"/.bootstrap-*
touch "$stamp"
echo "bootstrap: done"
