"""OpenLineage for checkpointed pipelines: dataset names (:mod:`.naming`), the stage and commit
tasks' datasets and run facet (:mod:`.facets`, :mod:`.epoch`) and ``iceberg://`` asset URIs
(:mod:`.assets`). The OpenLineage provider is imported lazily: the package works without it.
"""
