"""Operations over a pipeline's log, built on the protocol (which never imports them).

``retention`` (delete checkpoints nothing needs), ``evolution`` (audited state rename /
drop / reset, rescale).

Also: ``replay`` (Replay: epochs N..M processed again with the stage's current code, their
output replaced).
"""
