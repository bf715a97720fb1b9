#!/usr/bin/env bash
# Archive the classes a Spark driver loads (JDK class-data sharing) for the JVMs the tests
# start: tests/conftest.py FAST_JVM_OPTIONS points them at .venv/spark-cds.jsa, and a JVM
# that maps the archive starts a short spark-submit in about half the time (6.0 -> 3.4 s
# on 2 cores). Idempotent: kept while the JDK, the Spark jars and scripts/spark_cds_app.py
# are those it was made with. A JVM ignores a missing or unusable archive (another
# SPARK_CONF_DIR, say) and starts as it would without it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

archive=.venv/spark-cds.jsa
java=${JAVA_HOME:+$JAVA_HOME/bin/}java
spark_home=$(.venv/bin/python -c 'from pyspark.find_spark_home import _find_spark_home; print(_find_spark_home())')
key=$({ "$java" -version 2>&1; ls -l "$spark_home/jars"; cat scripts/spark_cds_app.py "${BASH_SOURCE[0]}"; } \
      | sha256sum | cut -d' ' -f1)
if [[ -f $archive && -f $archive.key && $(cat "$archive.key") == "$key" ]]; then
    exit 0
fi

echo "spark-cds: archiving the Spark driver's classes into $archive"
rm -f "$archive" "$archive.key"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The same flags as FAST_JVM_OPTIONS, and the class path the tests' JVMs get (they run
# without SPARK_HOME and SPARK_CONF_DIR); the JVM writes the archive when it exits.
env -u SPARK_HOME -u SPARK_CONF_DIR PYSPARK_PYTHON=$PWD/.venv/bin/python timeout 300 .venv/bin/spark-submit --master 'local[2]' \
    --conf spark.driver.host=127.0.0.1 --conf spark.driver.bindAddress=127.0.0.1 \
    --driver-java-options "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ArchiveClassesAtExit=$work/spark-cds.jsa -Xlog:cds*=off" \
    scripts/spark_cds_app.py "$work/out" >"$work/log" 2>&1 || { tail -n 20 "$work/log" >&2; exit 1; }
mv "$work/spark-cds.jsa" "$archive"
echo "$key" >"$archive.key"
