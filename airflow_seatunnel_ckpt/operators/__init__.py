"""Airflow operators of the checkpointed-pipeline provider."""
