"""Tests of the Airflow layer: real Airflow on SQLite, real core, real local Spark."""
