#!/usr/bin/env bash
# Run the example pipeline (airflow_seatunnel_ckpt.example); arguments are passed through.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh

exec .venv/bin/python -m airflow_seatunnel_ckpt.example "$@"
