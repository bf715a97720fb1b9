"""fsspec URLs (what the store and the user speak) versus Hadoop paths (what Spark reads): S3 is the exception, fsspec's
``s3://`` is Hadoop's ``s3a://``."""

from __future__ import annotations

import os

from airflow_seatunnel_ckpt.core.errors import ConfigError

#: fsspec protocol -> Hadoop filesystem scheme, where they differ.
_HADOOP_SCHEMES = {"s3": "s3a", "s3a": "s3a", "local": "file"}
#: fsspec-only stores that no Spark executor can reach.
_PROCESS_LOCAL = {"memory"}


def hadoop_path(url: str) -> str:
    """The Hadoop path Spark should be given for the fsspec URL ``url`` (a bare local path becomes ``file://<absolute
    path>``)."""
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    scheme, rest = url.split("://", 1)
    if scheme in _PROCESS_LOCAL:
        raise ConfigError(f"{url}: a {scheme}:// location lives in one Python process and cannot be read "
                          "or written "
                          "by Spark; use a file://, hdfs:// or object-store URL for Spark sources and sinks")
    if "::" in scheme:
        raise ConfigError(f"{url}: chained fsspec URLs cannot be given to Spark")
    return f"{_HADOOP_SCHEMES.get(scheme, scheme)}://{rest}"


def fsspec_url(url: str) -> str:
    """The fsspec URL for ``url`` (a bare path becomes ``file://<absolute path>``)."""
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    scheme, rest = url.split("://", 1)
    return f"s3://{rest}" if scheme == "s3a" else url
