#!/usr/bin/env bash
# Run the example pipeline (dags/orders_example.py); arguments are passed through.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh

exec .venv/bin/python dags/orders_example.py "$@"
