"""Airflow sensors of the checkpointed-pipeline provider."""
