"""The "Checkpoints" page of the Airflow UI (:mod:`.app`), gathered with the console's functions."""
