"""Airflow hooks of the checkpointed-pipeline provider."""
