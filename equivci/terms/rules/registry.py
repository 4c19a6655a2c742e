"""Named rules and their families: every rule carries a name ("family/what") and the identity it
states, and each family is one egglog ruleset. The registry (equivci.terms.rules.FAMILIES) is what
tests/terms/test_rules_numeric.py checks its instances against."""

from __future__ import annotations

import dataclasses

from egglog import RewriteOrRule, Ruleset, rule, ruleset


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str  # "family/what", unique
    identity: str  # the identity the rule states, in one line
    egglog: RewriteOrRule


@dataclasses.dataclass(frozen=True)
class _Pending:
    name: str
    identity: str
    facts: tuple

    def then(self, *actions) -> Rule:
        return Rule(self.name, self.identity, rule(*self.facts, name=self.name).then(*actions))


def named(name: str, identity: str, *facts) -> _Pending:
    """`rule(*facts)` with a name and the identity it states; finish it with `.then(*actions)`."""
    return _Pending(name, identity, facts)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    rules: tuple[Rule, ...]
    ruleset: Ruleset

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rules)


def family(name: str, *rules: Rule) -> Family:
    wrong = [r.name for r in rules if not r.name.startswith(name + "/")]
    assert not wrong, f"rules {wrong} are not named {name}/..."
    return Family(name, rules, ruleset(*(r.egglog for r in rules), name=name))
