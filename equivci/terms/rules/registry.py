"""Named rules and their families: every rule carries a name ("family/what") and the identity it
states, and each family is one egglog ruleset. The registry (equivci.terms.rules.FAMILIES) is what
tests/terms/test_rules_numeric.py checks its instances against."""

from __future__ import annotations

import dataclasses

from egglog import RewriteOrRule, Ruleset, rule, ruleset
from egglog.egraph import UnstableCombinedRuleset


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str  # "family/what", unique
    identity: str  # the identity the rule states, in one line
    egglog: RewriteOrRule
    seeds: tuple[RewriteOrRule, ...] = ()  # joins run as rules of their own, recording what `egglog` starts from


@dataclasses.dataclass(frozen=True)
class _Pending:
    name: str
    identity: str
    facts: tuple
    seeds: tuple = ()

    def seeded(self, record, *facts) -> _Pending:
        """Join `facts` in a rule of their own that records each match as the relation atom `record`,
        for this rule's facts to start from. egglog orders a rule's join by variable alone, each by
        the size of its smallest table, not by what is bound already: in a long pattern it can bind a
        variable of one branch before the op that links it to the others, and scan a whole table once
        per partial match (a search that grows with the program, and is paid again at every iteration
        of a deep one). A seed cuts the pattern where it must be read from an existing node."""
        seed = rule(*facts, name=f"{self.name}#seed{len(self.seeds)}").then(record)
        return dataclasses.replace(self, seeds=(*self.seeds, seed))

    def then(self, *actions) -> Rule:
        return Rule(self.name, self.identity, rule(*self.facts, name=self.name).then(*actions), self.seeds)


def named(name: str, identity: str, *facts) -> _Pending:
    """`rule(*facts)` with a name and the identity it states; finish it with `.then(*actions)`."""
    return _Pending(name, identity, facts)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    rules: tuple[Rule, ...]
    main: Ruleset  # the rules themselves
    seeds: Ruleset | None  # their seeds: the saturation runs them before the rules, in the same pass

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rules)

    @property
    def ruleset(self) -> Ruleset | UnstableCombinedRuleset:
        """The family on its own: seeds and rules in one pass (a seed is read at the next pass)."""
        return self.main if self.seeds is None else self.seeds | self.main


def family(name: str, *rules: Rule) -> Family:
    wrong = [r.name for r in rules if not r.name.startswith(name + "/")]
    assert not wrong, f"rules {wrong} are not named {name}/..."
    seeds = [s for r in rules for s in r.seeds]
    return Family(
        name,
        rules,
        ruleset(*(r.egglog for r in rules), name=name),
        ruleset(*seeds, name=f"{name}#seeds") if seeds else None,
    )
