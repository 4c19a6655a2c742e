"""The rewrite rules over tensor terms, by family. Every rewrite is an identity over the reals on
well-typed terms (tests/terms/test_rules_numeric.py checks an instance of each on random arrays);
rules only create terms whose dimensions are known, and guards compare dimensions where a rule
would otherwise build an ill-typed term.

To add a rule: write it with `named("family/what", "the identity", *facts).then(*actions)` in its
family's module, and add an instance to tests/terms/test_rules_numeric.py (the registry below is
what that test's coverage check reads)."""

from __future__ import annotations

import functools
import operator

from equivci.terms.rules.aligned import ALIGNED
from equivci.terms.rules.concats import CONCATS
from equivci.terms.rules.dims import DIMS
from equivci.terms.rules.dots import DOTS
from equivci.terms.rules.dynamic import DYNAMIC
from equivci.terms.rules.elementwise import ELEMENTWISE
from equivci.terms.rules.layouts import LAYOUTS
from equivci.terms.rules.reductions import REDUCTIONS
from equivci.terms.rules.registry import Family
from equivci.terms.rules.relations import RELATIONS
from equivci.terms.rules.repeats import REPEATS
from equivci.terms.rules.slices import SLICES

# The identities between values, in the order they are combined for saturation.
REWRITE_FAMILIES: tuple[Family, ...] = (
    SLICES,
    ELEMENTWISE,
    CONCATS,
    DOTS,
    REDUCTIONS,
    ALIGNED,
    LAYOUTS,
    REPEATS,
    DYNAMIC,
)
FAMILIES: dict[str, Family] = {f.name: f for f in (DIMS, *REWRITE_FAMILIES, RELATIONS)}

REWRITES = (
    SLICES.main
    | ELEMENTWISE.main
    | CONCATS.main
    | DOTS.main
    | REDUCTIONS.main
    | ALIGNED.main
    | LAYOUTS.main
    | REPEATS.main
    | DYNAMIC.main
)
# What the rules above start from (registry._Pending.seeded), recorded before them in each pass.
SEEDS = functools.reduce(operator.or_, [f.seeds for f in REWRITE_FAMILIES if f.seeds is not None])
