"""Checkpointed state, as stored: parts, checkpoints (chains, ``_metadata``, verify), sorted
runs and their chains, key groups. Nothing here imports the protocol."""
