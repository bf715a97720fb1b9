"""Airflow triggers of the checkpointed-pipeline provider."""
