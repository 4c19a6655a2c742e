"""`related` is for localization only (never for a verdict): a value is related when it is a slice,
or a pure re-layout (reshape, transpose) of one, of some reference value."""

from __future__ import annotations

from egglog import eq

from equivci.terms.language import T, a, b, d, e, related, spec, x, y
from equivci.terms.rules.registry import family, named

RELATIONS = family(
    "relations",
    named("relations/slice", "a slice of a related value is related", related(x), eq(e).to(x.slice(d, a, b))).then(
        related(e)
    ),
    named(
        "relations/reshape", "a reshape of a related value is related", related(x), eq(e).to(T.reshape(spec, x))
    ).then(related(e)),
    named(
        "relations/reshape_operand",
        "the operand of a related reshape is related (a reshape is undone by another)",
        related(e),
        eq(e).to(T.reshape(spec, x)),
    ).then(related(x)),
    named(
        "relations/concat_parts",
        "the parts of a related concatenation are related (each is a slice of it)",
        related(e),
        eq(e).to(T.concat(x, y, d)),
    ).then(related(x), related(y)),
    named(
        "relations/transpose", "a transpose of a related value is related", related(x), eq(e).to(T.transpose(spec, x))
    ).then(related(e)),
)
