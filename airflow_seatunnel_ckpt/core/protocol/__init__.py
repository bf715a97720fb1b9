"""The epoch protocol: the transitions of one epoch and the records that decide them (the module
map is in docs/ARCHITECTURE.md)."""
