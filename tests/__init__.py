"""Test suite for airflow-seatunnel-ckpt (shared fixtures live in conftest.py)."""
