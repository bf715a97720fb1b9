"""Operations over a pipeline's log, built on the protocol (which never imports them): retention,
evolution, replay."""
