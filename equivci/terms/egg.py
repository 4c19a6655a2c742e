"""egglog commands built directly as egglog's bindings, not through egglog-python's expressions.

egglog-python resolves the types of every expression and converts it to a command at about 1 ms a
term: the loader's main cost on a large program. The loader's commands are few in shape (a term
constructor over handles and literals, a table row, a relation row), so it builds them itself; the
egg name of each callable is the one egglog-python gives it in this e-graph (declared on first use),
so the rules and checks written with egglog-python's expressions meet the same functions.
"""

from __future__ import annotations

from egglog import EGraph, bindings
from egglog.egraph_state import span
from egglog.runtime import resolve_callable

_SPAN = span()
Arg = bindings.Call | bindings.Lit | int | str


def lit(value: int | str) -> bindings.Lit:
    return bindings.Lit(_SPAN, bindings.String(value) if isinstance(value, str) else bindings.Int(int(value)))


class Commands:
    """The commands of one e-graph; `callables` names every function they may use."""

    def __init__(self, egraph: EGraph, callables: dict[str, object]):
        self.egraph = egraph
        self._callables = callables
        self._names: dict[str, str] = {}

    def name(self, key: str) -> str:
        found = self._names.get(key)
        if found is None:
            ref, decls = resolve_callable(self._callables[key])
            self.egraph._add_decls(decls)
            found, reverse = self.egraph._state.callable_ref_to_egg(ref)
            if reverse:  # no function of the term language is declared with reversed arguments
                raise ValueError(f"{key}: egglog reverses its arguments")
            self._names[key] = found
        return found

    def call(self, key: str, *args: Arg) -> bindings.Call:
        return bindings.Call(
            _SPAN, self.name(key), [a if isinstance(a, bindings.Call | bindings.Lit) else lit(a) for a in args]
        )

    def union(self, a: bindings.Call, b: bindings.Call) -> bindings.ActionCommand:
        return bindings.ActionCommand(bindings.Union(_SPAN, a, b))

    def set(self, key: str, args: tuple[Arg, ...], value: int | str) -> bindings.ActionCommand:
        call = self.call(key, *args)
        return bindings.ActionCommand(bindings.Set(_SPAN, call.name, call.args, lit(value)))

    def row(self, key: str, *args: Arg) -> bindings.ActionCommand:
        """A row of a relation."""
        return bindings.ActionCommand(bindings.Expr_(_SPAN, self.call(key, *args)))

    def run(self, commands: list) -> None:
        self.egraph._state.run_program(*commands)
