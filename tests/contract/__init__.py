"""The connector contract suite: one set of promises, each connector supplies a small context.

Shaped like Flink's connector testing framework (``SinkTestSuiteBase`` /
``SourceTestSuiteBase``): the promises are written once (``test_*.py``) against
:class:`tests.contract.sinks.SinkContext` and :class:`tests.contract.sources.SourceContext`,
and each connector gives a context. A sink's context (files, Iceberg, Delta, PostgreSQL)
creates its target, names its options per mode, stages an epoch's files and reads the
target back, now and at every point of its history a reader can pin; epochs run through the
real protocol (:class:`tests.contract.sinks.Epochs`): begin, stage, prepare, decide, commit,
and replay. A source's context (files, Iceberg, Delta, another pipeline's output, Kafka)
adds input, removes it and replaces it under its identity; a downstream pipeline reads it
through the Spark stage runtime (:class:`tests.contract.sources.Reads`). Internals of the
package are imported by the context classes only. A new connector is done when it passes.
"""
