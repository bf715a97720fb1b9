"""Sources on the Spark side: read exactly the input an epoch pinned."""
