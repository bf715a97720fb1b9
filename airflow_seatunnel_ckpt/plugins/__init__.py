"""The "Checkpoints" page of the Airflow UI: an Airflow 3 plugin registered by the provider.

:mod:`.checkpoints` is the plugin (a FastAPI app plus external views), :mod:`.app` the
app and its routes, :mod:`.stores` which stores the page shows, :mod:`.overview` what it
shows of them -- gathered with the same functions the ``seatunnel-ckpt`` console uses.
"""
