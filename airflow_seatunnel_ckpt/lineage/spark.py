"""OpenLineage parent-job information for a stage's ``spark-submit``, as the Spark provider adds it.

With ``[openlineage] spark_inject_parent_job_info = True`` (the setting the Apache Spark
provider's ``SparkSubmitOperator`` reads), the stage's Spark configuration gets
``spark.openlineage.parentJobNamespace``, ``parentJobName``, ``parentRunId`` and the root
parent's, so the OpenLineage Spark listener (when the application has it) reports the
Spark job as a child of the stage task's run. ``spark_inject_transport_info`` likewise
copies the HTTP transport. Keys the user already set are left alone, and without the
OpenLineage provider nothing is added (the compat layer only logs that).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context


def with_openlineage_spark_properties(spark_conf: Mapping[str, Any], context: Context) -> dict[str, Any]:
    """``spark_conf`` plus the OpenLineage parent-job (and transport) properties that are enabled.

    The one call a launcher makes before ``spark-submit``; returns a new dict.
    """
    from airflow.providers.common.compat.sdk import conf

    properties = dict(spark_conf)
    if conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False):
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
        )

        properties = inject_parent_job_information_into_spark_properties(properties, context)
    if conf.getboolean("openlineage", "spark_inject_transport_info", fallback=False):
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_transport_information_into_spark_properties,
        )

        properties = inject_transport_information_into_spark_properties(properties, context)
    return properties
