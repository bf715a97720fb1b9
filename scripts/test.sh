#!/usr/bin/env bash
# Run the test suite: bootstrap .venv, then pytest with any extra arguments.
#   bash scripts/test.sh                     # everything
#   bash scripts/test.sh -m "not cluster"    # skip the Spark standalone tests
#   bash scripts/test.sh tests/test_infra_s3.py -x
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
# The Checkpoints page is tested in a real headless Chromium (Debian's package).
bash scripts/install-browser.sh

status=0
.venv/bin/python -m pytest -p no:cacheprovider -q --durations=15 "$@" || status=$?

# pytest exits with 5 when nothing was collected (a typo in a path or -k/-m expression);
# a run that proved nothing must not pass.
if [[ $status -eq 5 ]]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$status"
