"""The protocol's invariants (docs/ARCHITECTURE.md), checked against the store and the published output.

:func:`check_world` reads only what a user could read -- the published ``epoch=<e>``
directories of every sink, the transaction log, the restore point -- and returns the
list of violations (empty means every invariant holds):

1. exactly once: every input record consumed so far is in the published output of each
   sink exactly once (and with ``drained``, every input record at all);
2. per-epoch atomicity: every committed epoch has complete output (all manifest files
   and ``_SUCCESS``) in every sink, both sinks hold the same records, and an epoch that
   is not committed has nothing published;
3. one decision: ``committed`` only after a commit decision, ``aborted`` only after an
   abort decision;
4. the restore point is a committed, verified checkpoint and its keyed state equals the
   counts of the published records;
5. the output of an epoch was staged by the attempt its decision names;
6. with ``clean``: no staging, no temp file anywhere, no checkpoint of an aborted epoch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from airflow_seatunnel_ckpt.core import Decision, EpochState, layout
from airflow_seatunnel_ckpt.core.sinks.files import OWNER_MARKER
from airflow_seatunnel_ckpt.core.storage import TEMP_PREFIX
from tests.integration.reliability import synthetic


def published(world: synthetic.World) -> dict[str, dict[int, dict[str, Any]]]:
    """sink -> epoch -> {"records": [...], "attempts": {...}, "success": bool, "files": {...}}."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for sink in synthetic.SINKS:
        target = world.target_storage(sink)
        by_epoch: dict[int, dict[str, Any]] = {}
        for f in target.walk("", include_temp=True):
            if f.path == OWNER_MARKER:
                continue
            head, _, name = f.path.partition("/")
            epoch = layout.parse_staging_epoch(head)
            if epoch is None:
                by_epoch.setdefault(-1, {"records": [], "attempts": set(), "success": False, "files": {}})
                by_epoch[-1]["files"][f.path] = f.size
                continue
            entry = by_epoch.setdefault(epoch, {"records": [], "attempts": set(), "success": False, "files": {}})
            entry["files"][name] = f.size
            if name == layout.SUCCESS:
                entry["success"] = True
            elif not name.startswith(("_", ".")):
                for line in target.read(f.path).decode().splitlines():
                    record, attempt = line.rsplit(",", 1)
                    entry["records"].append(record)
                    entry["attempts"].add(int(attempt))
        out[sink] = by_epoch
    return out


def check_world(world: synthetic.World, *, drained: bool = False, clean: bool = True) -> list[str]:
    """Every violated invariant, as readable sentences ([] = all hold)."""
    p = world.pipeline()
    problems: list[str] = []
    epochs = p.epochs()
    states = {e: p.state(e) for e in epochs}
    committed = [e for e, s in states.items() if s is EpochState.COMMITTED]
    out = published(world)

    # 3. one decision per epoch, consistent with the acknowledgements
    for epoch, state in states.items():
        decision = p.txlog.read_decision(epoch)
        if state is EpochState.COMMITTED and (decision is None or decision.decision is not Decision.COMMIT):
            problems.append(f"epoch {epoch} is COMMITTED without a commit decision")
        if state is EpochState.ABORTED and (decision is None or decision.decision is not Decision.ABORT):
            problems.append(f"epoch {epoch} is ABORTED without an abort decision")
        if clean and not state.final:
            problems.append(f"epoch {epoch} is still {state.value} after recovery")

    # 2 + 5. per-epoch atomicity across sinks, winner-only output
    consumed: list[str] = []
    for sink, by_epoch in out.items():
        if -1 in by_epoch:
            problems.append(f"sink {sink}: files outside any epoch directory: {sorted(by_epoch[-1]['files'])}")
        for epoch in sorted(e for e in by_epoch if e >= 0):
            if states.get(epoch) is not EpochState.COMMITTED:
                problems.append(
                    f"sink {sink}: epoch {epoch} is {states.get(epoch)} but has published files "
                    f"{sorted(by_epoch[epoch]['files'])}"
                )
    for epoch in committed:
        decision = p.txlog.read_decision(epoch)
        assert decision is not None
        record = p.txlog.read_prepared(epoch, synthetic.PARTICIPANT)
        winner = decision.participants.get(synthetic.PARTICIPANT)
        if record is None or record.attempt != winner:
            problems.append(f"epoch {epoch}: prepared record does not match the decision's winner {winner}")
            continue
        files = record.sources[synthetic.SOURCE].offsets["files"]
        expected = Counter(world.input_records(files))
        consumed += list(expected.elements())
        for manifest in record.sinks:
            entry = out[manifest.sink].get(epoch)
            if not manifest.publishes:  # no rows: the epoch publishes nothing, not an empty directory
                if entry is not None:
                    problems.append(f"sink {manifest.sink}: committed epoch {epoch} staged no rows but "
                                    f"published {sorted(entry['files'])}")
                continue
            if entry is None:
                problems.append(f"sink {manifest.sink}: committed epoch {epoch} published nothing")
                continue
            if not entry["success"]:
                problems.append(f"sink {manifest.sink}: committed epoch {epoch} has no _SUCCESS")
            for f in manifest.files:
                if entry["files"].get(f.path) != f.size:
                    problems.append(
                        f"sink {manifest.sink}: epoch {epoch} file {f.path} is "
                        f"{entry['files'].get(f.path)} bytes, manifest says {f.size}"
                    )
            if Counter(entry["records"]) != expected:
                problems.append(
                    f"sink {manifest.sink}: epoch {epoch} published {sorted(entry['records'])}, "
                    f"its input was {sorted(expected.elements())}"
                )
            if entry["attempts"] - {winner}:
                problems.append(
                    f"sink {manifest.sink}: epoch {epoch} holds output of attempts "
                    f"{sorted(entry['attempts'])}, the winner is {winner}"
                )
            extra = [n for n in entry["files"] if n.startswith(TEMP_PREFIX) or n.startswith("_temporary")]
            if clean and extra:
                problems.append(f"sink {manifest.sink}: epoch {epoch} has leftover files {extra}")

    # 1. exactly once across epochs
    counts = Counter(consumed)
    dups = sorted(r for r, n in counts.items() if n > 1)
    if dups:
        problems.append(f"records published more than once: {dups[:10]}")
    for sink, by_epoch in out.items():
        records = Counter(r for e, entry in by_epoch.items() if e >= 0 for r in entry["records"])
        if records != counts:
            lost = sorted(set(counts) - set(records))
            extra = sorted((records - counts).elements())
            problems.append(
                f"sink {sink}: published output differs from the consumed input "
                f"(missing {lost[:10]}, extra {extra[:10]})"
            )
    if drained:
        missing = sorted(set(world.input_records()) - set(counts))
        if missing:
            problems.append(f"input records never published: {missing[:10]} ({len(missing)} in all)")

    # 4. restore point: committed, verified, state equals published counts
    try:
        point = p.restore_point()
    except Exception as exc:  # reported as a violation with the error
        problems.append(f"restore_point failed: {type(exc).__name__}: {exc}")
    else:
        if committed and point.epoch != committed[-1]:
            problems.append(f"restore point is epoch {point.epoch} ({point.how}), newest committed is {committed[-1]}")
        if point.how not in ("primary", "empty"):
            problems.append(f"restore point needed a fallback ({point.how}): {point.skipped}")
        if point.epoch is not None:
            op = point.operators.get(synthetic.OPERATOR)
            restored = synthetic.read_state(p, op.chains, point.storage) if op else {}
            want = Counter(synthetic.key_of(r) for r in consumed)
            if {k: v for k, v in restored.items() if v} != dict(want):
                problems.append(f"restored keyed state {restored} != counts of published records {dict(want)}")
            sources = {f for entry in point.source_entries(synthetic.SOURCE) for f in entry["offsets"]["files"]}
            published_files = {r.split(":")[0] for r in consumed}
            if {str(int(f[3:8])) for f in sources} != published_files:
                problems.append("restored source offsets do not match the published input files")

    # 6. garbage
    if clean:
        leftovers = [f.path for f in p.storage.walk(layout.STAGING, include_temp=True)]
        if leftovers:
            problems.append(f"staging left after recovery: {leftovers[:5]}")
        temps = [
            f.path for f in p.storage.walk("", include_temp=True) if f.path.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)
        ]
        if temps:
            problems.append(f"temp files left after recovery: {temps[:5]}")
        if drained:  # drain() ended with retention, which sweeps losing attempts' parts
            # (a checkpoint with damaged _metadata is left alone by retention, by design)
            unreferenced = unreferenced_checkpoint_files(world, intact_only=True)
            if unreferenced:
                problems.append(f"checkpoint files nothing references after retention: {unreferenced[:5]}")
        for epoch in p.checkpoints.epochs():
            if states.get(epoch) is not EpochState.COMMITTED:
                files = [f.path for f in p.storage.walk(layout.checkpoint_dir(epoch), include_temp=True)]
                if files:
                    problems.append(f"checkpoint_{epoch} of a {states.get(epoch)} epoch still has {files[:5]}")
    return problems


def snapshot(world: synthetic.World) -> dict[str, int]:
    """Every file of the store and the targets with its size (to prove nothing changed)."""
    p = world.pipeline()
    files = {f"store:{f.path}": f.size for f in p.storage.walk("", include_temp=True)}
    for sink in synthetic.SINKS:
        files.update({f"{sink}:{f.path}": f.size for f in world.target_storage(sink).walk("", include_temp=True)})
    return files


def end_state(world: synthetic.World) -> dict[str, Any]:
    """What two runs of the same recovery must agree on: epoch states, published files and
    their sizes, the store's file names (record timestamps may differ), the restore point."""
    p = world.pipeline()
    out: dict[str, Any] = {"states": {e: p.state(e).value for e in p.epochs()}}
    out["store"] = sorted(f.path for f in p.storage.walk("", include_temp=True))
    for sink in synthetic.SINKS:
        out[f"sink {sink}"] = {f.path: f.size for f in world.target_storage(sink).walk("", include_temp=True)}
    point = p.restore_point()
    out["restore"] = (point.epoch, point.how)
    return out


def unreferenced_checkpoint_files(world: synthetic.World, intact_only: bool = False) -> list[str]:
    """Files in committed checkpoints that no retained ``_metadata`` needs.

    These are parts written by attempts that lost (a fenced zombie, a killed attempt that
    was retried) and not yet swept by retention: harmless, never restored. With
    ``intact_only``, only in checkpoints whose ``_metadata`` reads.
    """
    p = world.pipeline()
    referenced: set[str] = set()
    intact = []
    for epoch in p.checkpoints.epochs():
        try:
            meta = p.checkpoints.read_metadata(epoch)
        except Exception:  # retired or damaged: nothing of it is referenced from here
            continue
        intact.append(epoch)
        referenced.add(layout.metadata_path(epoch))
        referenced.update(ref.path for ref in meta.parts())
    out = []
    for epoch in intact if intact_only else p.checkpoints.epochs():
        root = layout.checkpoint_dir(epoch)
        for f in p.storage.walk(root, include_temp=True):
            path = f"{root}/{f.path}"
            if path not in referenced:
                out.append(path)
    return out
