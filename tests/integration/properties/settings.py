"""How much the model-based tests explore: a fast, deterministic slice by default, a deep
run on demand.

``PROPERTIES_EXAMPLES=<n>`` (e.g. 500) turns on the deep run: ``n`` random examples per
model, longer step sequences, fresh randomness each run. Without it every model runs a few
derandomized examples (the same ones each run), so the default suite stays fast and
repeatable. ``PROPERTIES_SHRINK=1`` shrinks a failure of the fast slice to a minimal
example too (off there by default: it takes minutes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import INVARIANT_MARKER, RuleBasedStateMachine, run_state_machine_as_test

#: Examples per model in the deep run (0: the fast slice).
DEEP_EXAMPLES = int(os.environ.get("PROPERTIES_EXAMPLES", "0") or 0)
#: Shrink a failing example to a minimal one (on by default in the deep run only: each
#: step of a model runs whole epochs, so shrinking takes minutes).
SHRINK = os.environ.get("PROPERTIES_SHRINK", "1" if DEEP_EXAMPLES else "0") == "1"


def model_settings(fast_examples: int, fast_steps: int, deep_steps: int | None = None) -> settings:
    """Hypothesis settings of one state machine: the fast slice, or the deep run."""
    deep = DEEP_EXAMPLES > 0
    return settings(
        max_examples=DEEP_EXAMPLES if deep else fast_examples,
        stateful_step_count=(deep_steps or 2 * fast_steps) if deep else fast_steps,
        derandomize=not deep,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        print_blob=deep,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if SHRINK else [])],
    )


def run_model(machine: type[RuleBasedStateMachine], scenario: Callable[[RuleBasedStateMachine], Iterable[object]],
              fast_examples: int, fast_steps: int) -> None:
    """The deep run of ``machine`` (Hypothesis), or else its fixed ``scenario``.

    A model whose every step runs whole epochs gets only a few steps in the fast slice, and
    derandomized Hypothesis may spend them all on its cheapest rule (for a replay model: no
    replay at all). The fast slice therefore runs ``scenario``: a generator that calls the
    machine's own rules in a chosen order, yielding after each step, and the machine's
    invariants are checked after every step as Hypothesis would.
    """
    if DEEP_EXAMPLES:
        run_state_machine_as_test(machine, settings=model_settings(fast_examples, fast_steps))
        return
    model = machine()
    invariants = [getattr(model, name) for name in dir(type(model))
                  if getattr(getattr(type(model), name, None), INVARIANT_MARKER, None)]
    assert invariants, f"{machine.__name__} declares no invariant"
    try:
        for _step in scenario(model):
            for check in invariants:
                check()
    finally:
        model.teardown()
