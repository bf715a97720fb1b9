"""Checkpointed, exactly-once PySpark batch pipelines orchestrated by Apache Airflow.

The ``core`` package is free of Airflow and PySpark; ``spark`` holds the stage runtime and
the ``hooks``/``operators``/``sensors``/``triggers`` packages form the Airflow provider.
"""

__version__ = "0.1.0"
