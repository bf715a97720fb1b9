"""OpenLineage for checkpointed pipelines: dataset names, facets, Spark parent-job info, asset URIs.

* :mod:`.naming` -- OpenLineage dataset names of locations and tables (pure, no I/O);
* :mod:`.facets` -- the datasets and run facet of the stage and commit tasks;
* :mod:`.spark` -- parent-job information for a stage's ``spark-submit``;
* :mod:`.assets` -- the ``iceberg://`` asset URIs the provider registers.

Everything that needs the OpenLineage provider imports it lazily: the package works
without it (install the ``openlineage`` extra for lineage).
"""
