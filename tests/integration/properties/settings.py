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

from hypothesis import HealthCheck, Phase, settings

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
