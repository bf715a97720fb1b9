"""Checkpointed state, as stored: parts, keyed state and consumed input.

``parts`` (one framed part, written / read whole), ``checkpoint`` (key-group chains,
``_metadata``, verify), ``runs`` + ``run_chain`` (sorted runs with bloom filters and a
block cache; lookups newest first, compaction), ``key_groups`` (Spark's key-group
placement without Spark). Each epoch's consumed input is the sources' (:mod:`core.sources`).
Nothing here imports the protocol.
"""
