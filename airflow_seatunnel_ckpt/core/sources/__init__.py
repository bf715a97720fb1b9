"""Sources: what an epoch reads, pinned before it is read (see docs/ARCHITECTURE.md)."""
