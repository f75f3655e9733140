"""Hypothesis budgets: each property says how many examples it runs under the ``ci`` profile;
the loaded profile (tests/conftest.py) scales that, so ``dev`` runs a tenth."""

from __future__ import annotations

from hypothesis import settings

#: max_examples of the ci profile: a property whose examples are cheap runs this many.
CI_EXAMPLES = 100


def examples(ci: int) -> int:
    """``ci`` examples under the ci profile, scaled by the loaded profile (at least one)."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)
