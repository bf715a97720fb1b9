"""Sinks on the Spark side: what a stage writes for an epoch, staged until the commit."""
