"""The connector contract suite: one set of promises, each table sink supplies a small context.

Shaped like Flink's connector testing framework (``SinkTestSuiteBase``): the promises are
written once (``test_*.py``) against :class:`tests.contract.sinks.SinkContext`, and each
connector (Iceberg, Delta, PostgreSQL) gives a context that creates its target, names its
options per mode, stages an epoch's files and reads the target back, now and at every point
of its history a reader can pin. Epochs run through the real protocol
(:class:`tests.contract.sinks.Epochs`): begin, stage, prepare, decide, commit, and replay.
"""
