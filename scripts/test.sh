#!/usr/bin/env bash
# Run the test suite: bootstrap .venv, then pytest on parallel workers with any extra arguments.
#   bash scripts/test.sh                     # everything (the README's command and CI's)
#   bash scripts/test.sh --quick             # unit tests and a fast slice: no Spark, deployment or crash campaigns
#   bash scripts/test.sh -m "not cluster"    # skip the Spark standalone tests
#   bash scripts/test.sh tests/integration/infra/test_s3.py -x
#   bash scripts/test.sh -m connect_all      # the stage tests' Connect runs outside CI's slice
# TEST_WORKERS=<n> sets the number of pytest-xdist workers (default: one more than the CPU count,
# at most 4, since a worker waits on servers, leases and polls part of the time; each worker has
# its own local[2] SparkSession, Airflow DB and S3 server); TEST_WORKERS=0 runs
# in this process. Tests start longest first (tests/durations.json; TEST_DURATIONS_WRITE=1
# rewrites it after a run). The slow suites, and the stage tests' Connect runs, run a fixed
# slice; RELIABILITY_FULL=1, RELIABILITY_SCHEDULES=<n> and PROPERTIES_EXAMPLES=<n> run the rest
# (docs/RELIABILITY.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=0
if [[ "${1:-}" == "--quick" ]]; then
    quick=1
    shift
fi

bash scripts/bootstrap.sh
if [[ $quick -eq 0 ]]; then
    # The tests' JVMs map the Spark driver's classes from an archive (docs/RELIABILITY.md),
    # made while the Checkpoints page's headless Chromium (Debian's package) installs.
    bash scripts/spark-cds.sh &
    cds=$!
    trap 'kill "$cds" 2>/dev/null || true' EXIT  # a failed browser install stops it too
    bash scripts/install-browser.sh
    wait "$cds"
    trap - EXIT
fi

cpus=$(nproc 2>/dev/null || echo 2)
workers=${TEST_WORKERS:-$((cpus < 3 ? cpus + 1 : 4))}
args=(-p no:cacheprovider -q --durations=15)
if [[ $workers -gt 0 ]]; then
    # loadgroup: tests that share one server (Spark standalone, browser, deployment) stay
    # on one worker, everything else is dealt out test by test.
    args+=(-n "$workers" --dist loadgroup)
fi
if [[ $quick -eq 1 ]]; then
    # No JVM, no Spark cluster, browser or deployment, no crash or damage campaigns.
    args+=(-m "not spark and not slow and not cluster and not browser and not crash and not deployment"
           --ignore=tests/integration/reliability --ignore=tests/integration/deployment)
fi

status=0
.venv/bin/python -m pytest "${args[@]}" "$@" || status=$?

# pytest exits with 5 when nothing was collected (a typo in a path or -k/-m expression);
# a run that proved nothing must not pass.
if [[ $status -eq 5 ]]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$status"
