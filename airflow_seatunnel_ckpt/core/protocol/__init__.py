"""The epoch protocol: the transitions of one epoch and the records that decide them.

``pipeline`` (one method per transition: begin, pin inputs, prepare, decide, commit, abort),
``txlog`` (write-once records; an epoch's state is which records exist), ``settled`` +
``sweep`` (the settled watermark, and the temp files swept before it covers an epoch),
``staging`` (attempt staging, manifests, the checkpoint's marker files), ``lease`` +
``submissions`` (liveness: is the stage of an epoch alive?), ``descriptor`` (owner,
settings, declared participants), ``expectations`` (sinks' rules, refused at decide),
``restore`` (where a new epoch's state restores from; the secondary replica),
``recovery`` (resolving an epoch a crash left unfinished: judge, then act; recover).
"""
