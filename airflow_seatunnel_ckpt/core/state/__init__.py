"""Checkpointed state, as stored: parts, keyed state and consumed input.

``parts`` (one framed part, written / read whole), ``checkpoint`` (key-group chains,
``_metadata``, verify), ``runs`` + ``run_chain`` (sorted runs with bloom filters and a
block cache; lookups newest first, compaction), ``key_groups`` (Spark's key-group
placement without Spark), ``source_log`` + ``file_index`` (each epoch's consumed input).
Nothing here imports the protocol.

Also: ``kafka_offsets`` (Kafka offsets as an epoch's position: planning from the committed
history and the broker's answers).
"""
