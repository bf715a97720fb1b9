"""OpenLineage datasets and run facet of an epoch's stage and commit tasks, from what the store says.

:data:`CheckpointEpochRunFacet` is ``None`` without the ``openlineage-python`` client (the
``openlineage`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_seatunnel_ckpt.core.catalogs import embedded_catalog
from airflow_seatunnel_ckpt.core.config import redact_url
from airflow_seatunnel_ckpt.core.models import ExpectationResult, PublishedSink, SinkManifest, SourceState
from airflow_seatunnel_ckpt.lineage.naming import dataset_name, source_url

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

RUN_FACET_KEY = "seatunnelCheckpointEpoch"
# The facet's JSON schema, shipped beside this module (``CheckpointEpochRunFacet.json``).
SCHEMA_URL = ("https://raw.githubusercontent.com/airflow-seatunnel-ckpt/airflow-seatunnel-ckpt/main/"
              "airflow_seatunnel_ckpt/lineage/CheckpointEpochRunFacet.json#/$defs/CheckpointEpochRunFacet")

try:  # the client is optional: the provider works without lineage
    import attr
    from openlineage.client.generated.base import RunFacet as _RunFacet
except ImportError:  # pragma: no cover - exercised only without the openlineage extra
    CheckpointEpochRunFacet: Any = None
else:

    @attr.define
    class CheckpointEpochRunFacet(_RunFacet):  # type: ignore[no-redef]
        """Where a task run stands in the pipeline's two-phase commit (fields: :class:`EpochFacts`)."""

        pipeline: str
        epoch: int | None = attr.field(default=None)
        attempt: int | None = attr.field(default=None)
        decision: str | None = attr.field(default=None)
        participant: str | None = attr.field(default=None)
        state: str | None = attr.field(default=None)
        attempts: dict[str, int] | None = attr.field(default=None)

        @staticmethod
        def _get_schema() -> str:
            return SCHEMA_URL


@dataclass
class EpochFacts:
    """What the run facet says (plain data, also without the OpenLineage client).

    ``attempt`` is the stage attempt whose output stands (a stage task) and ``attempts``
    every participant's winning attempt (the commit task); ``decision`` is ``commit``/``abort``
    once decided; ``state`` the epoch's state when the event was built.
    """

    pipeline: str
    epoch: int | None = None
    attempt: int | None = None
    decision: str | None = None
    participant: str | None = None
    state: str | None = None
    attempts: dict[str, int] = field(default_factory=dict)

    def run_facets(self) -> dict[str, Any]:
        """``{RUN_FACET_KEY: facet}``, or ``{}`` without the OpenLineage client."""
        if CheckpointEpochRunFacet is None:
            return {}
        return {RUN_FACET_KEY: CheckpointEpochRunFacet(**{**asdict(self), "attempts": dict(self.attempts) or None})}


def input_datasets(sources: Mapping[str, Mapping[str, Any]],
                   consumed: Mapping[str, SourceState] | None = None) -> list[Any]:
    """One ``InputDataset`` per source, with what ``consumed`` (the recorded offsets) read."""
    from airflow.providers.common.compat.openlineage.facet import InputDataset

    out: list[Any] = []
    for name, options in sorted(sources.items()):
        url = source_url(options)
        if url is None:
            continue
        ds = dataset_name(url)
        state = (consumed or {}).get(name)
        kind = str(options.get("type", "file"))
        if kind == "iceberg" and not options.get("catalog"):
            # as the Iceberg source resolves it: the embedded catalog
            options = {**options, "catalog": embedded_catalog()}
        facets = _table_facets(options, kind)
        input_facets: dict[str, Any] = {}
        if state is not None:
            facets.update(_version_facets(state.offsets))
            input_facets = _input_facets(state.offsets)
        out.append(InputDataset(namespace=ds.namespace, name=ds.name, facets=facets, inputFacets=input_facets))
    return unique_datasets(out)


def declared_output_datasets(sinks: Mapping[str, tuple[str, Mapping[str, Any] | None]]) -> list[Any]:
    """``OutputDataset`` per sink ``name -> (target_url, table options)``, no statistics."""
    from airflow.providers.common.compat.openlineage.facet import OutputDataset

    out = []
    for _name, (target, table) in sorted(sinks.items()):
        ds = dataset_name(target)
        out.append(OutputDataset(namespace=ds.namespace, name=ds.name, facets=_sink_facets(table)))
    return unique_datasets(out)


def staged_output_datasets(manifests: Iterable[SinkManifest]) -> list[Any]:
    """``OutputDataset`` per staged sink, with the rows, files and bytes the attempt staged."""
    return unique_datasets([_output(m.target_url, m.table, m.expectations, m.rows, m.bytes, len(m.files))
                    for m in sorted(manifests, key=lambda m: m.sink)])


def published_output_datasets(published: Iterable[PublishedSink],
                              tables: Mapping[str, Mapping[str, Any] | None],
                              quality: Mapping[str, Sequence[ExpectationResult]] | None = None) -> list[Any]:
    """``OutputDataset`` per sink that published something, with its published statistics, table
    facets (``tables``: sink -> table options) and data-quality facets (``quality``: sink -> results)."""
    return unique_datasets([_output(s.target_url, tables.get(s.sink), (quality or {}).get(s.sink, ()), s.rows, s.bytes,
                            s.files) for s in sorted(published, key=lambda s: s.sink) if s.published])


def _output(target_url: str, table: Mapping[str, Any] | None, expectations: Sequence[ExpectationResult],
            rows: int, size: int, files: int) -> Any:
    """One sink's ``OutputDataset``: its table and data-quality facets, and the statistics of its output."""
    from airflow.providers.common.compat.openlineage.facet import (
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )

    ds = dataset_name(target_url)
    stats = OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size, fileCount=files)
    return OutputDataset(namespace=ds.namespace, name=ds.name,
                         facets={**_sink_facets(table), **quality_facets(expectations)},
                         outputFacets={"outputStatistics": stats})


def operator_lineage(inputs: list[Any], outputs: list[Any], facts: EpochFacts) -> OperatorLineage:
    """The ``OperatorLineage`` the provider's listener puts in the task's event."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=facts.run_facets())


def _input_facets(offsets: Mapping[str, Any]) -> dict[str, Any]:
    """Statistics of what a source's recorded offsets say the epoch read (a custom source's unknown
    shape: none). File offsets list names, sized in ``identity``; table offsets ``{"path", "size", "records"}``."""
    from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet

    files = offsets.get("files")
    if not isinstance(files, list):
        return {}
    size = rows = 0
    sized = counted = True
    identity = offsets.get("identity") if isinstance(offsets.get("identity"), Mapping) else {}
    for entry in files:
        if isinstance(entry, Mapping):
            size_value, rows_value = entry.get("size"), entry.get("records")
        else:
            known = identity.get(str(entry)) if identity else None
            size_value = known.get("size") if isinstance(known, Mapping) else None
            rows_value = None
        sized = sized and isinstance(size_value, int)
        counted = counted and isinstance(rows_value, int)
        size += size_value if isinstance(size_value, int) else 0
        rows += rows_value if isinstance(rows_value, int) else 0
    stats = InputStatisticsInputDatasetFacet(fileCount=len(files), size=size if sized else None,
                                             rowCount=rows if counted and files else None)
    return {"inputStatistics": stats}


def _version_facets(offsets: Mapping[str, Any]) -> dict[str, Any]:
    """The table version an epoch read up to: Iceberg ``snapshot_id``, Delta ``version``."""
    for key in ("snapshot_id", "version"):
        value = offsets.get(key)
        if isinstance(value, int | str) and not isinstance(value, bool) and value != "":
            from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet

            return {"version": DatasetVersionDatasetFacet(datasetVersion=str(value))}
    return {}


def _table_facets(options: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Dataset facets of a source or sink that is a table (Iceberg, Delta); ``{}`` for files."""
    if kind not in ("iceberg", "delta"):
        return {}
    from openlineage.client.generated.storage_dataset import StorageDatasetFacet

    facets: dict[str, Any] = {"storage": StorageDatasetFacet(storageLayer=kind, fileFormat="parquet")}
    if kind == "iceberg":
        from openlineage.client.generated.catalog_dataset import CatalogDatasetFacet

        given = options.get("catalog")
        catalog: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        uri, warehouse = catalog.get("uri"), catalog.get("warehouse")
        facets["catalog"] = CatalogDatasetFacet(
            framework="iceberg", type=str(catalog.get("type") or "unknown"),
            name=str(options.get("catalog_name") or "default"),
            metadataUri=redact_url(uri) if isinstance(uri, str) else None,
            warehouseUri=redact_url(warehouse) if isinstance(warehouse, str) else None, source="pyiceberg")
    return facets


def quality_facets(results: Sequence[ExpectationResult]) -> dict[str, Any]:
    """The standard ``dataQualityMetrics`` and ``dataQualityAssertions`` facets of a sink's measured
    expectations, one assertion per rule (docs/EXPECTATIONS.md); none without expectations."""
    if not results:
        return {}
    from openlineage.client.generated.data_quality_assertions_dataset import (
        Assertion,
        DataQualityAssertionsDatasetFacet,
    )
    from openlineage.client.generated.data_quality_metrics_dataset import DataQualityMetricsDatasetFacet

    from airflow_seatunnel_ckpt.core.protocol.expectations import refusal

    assertions = []
    for r in results:
        limits = [f"max_fraction={r.max_fraction}"] if r.max_fraction is not None else []
        limits += [f"max_rows={r.max_rows}"] if r.max_rows is not None else []
        assertions.append(Assertion(
            assertion=r.name, name=r.name, success=r.failed == 0,
            severity="error" if r.on_fail == "fail" or limits else "warn",
            description=f"on_fail={r.on_fail}", content=r.expr, contentType="sql",
            actual=str(r.failed), expected=", ".join(limits) or ("0" if r.on_fail == "fail" else None),
            params={"on_fail": r.on_fail, "checked": r.checked, "failed": r.failed, "fraction": r.fraction,
                    "refused": refusal("", r) is not None}))
    return {"dataQualityMetrics": DataQualityMetricsDatasetFacet(columnMetrics={}, rowCount=results[0].checked),
            "dataQualityAssertions": DataQualityAssertionsDatasetFacet(assertions=assertions)}


def _sink_facets(table: Any) -> dict[str, Any]:
    """Dataset facets of a sink from its manifest's table options (a typed model; None: a file sink)."""
    if not table:
        return {}
    options = table.to_dict() if hasattr(table, "to_dict") else dict(table)
    return _table_facets(options, str(options.get("type", "")))


def unique_datasets(datasets: list[Any]) -> list[Any]:
    """``datasets`` without repeats of a namespace and name (two sinks into one table)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for ds in datasets:
        if (ds.namespace, ds.name) not in seen:
            seen.add((ds.namespace, ds.name))
            out.append(ds)
    return out
