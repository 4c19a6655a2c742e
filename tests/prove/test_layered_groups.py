"""Terms the translator states equal reach a layer's proof when only one of them is among the
layer's terms (equivci.prove.layered._ModelIndex.groups_reached).

The translator states a term's partner beside it (the written form of a transposed dot, the
unsqueezed op, a reference builder's facts); the partner is often made of terms nothing in the layer
uses, and may reach into an earlier layer. The programs here are built by hand, as the layer tests
build theirs: a second layer whose device value the rules relate to the reference only through
such a partner, whose terms take windows of the first layer's value.
"""

from __future__ import annotations

import dataclasses

from equivci.cache import Memo
from equivci.layers.segments import Layering, split
from equivci.prove.layered import _Abstraction, _ModelIndex, _Problem, prove_layers
from equivci.terms.ir import Term, TermTable
from equivci.translate.evaluator import Evaluator, Event
from equivci.translate.programs import Programs


@dataclasses.dataclass
class _Inst:
    op_name: str


def _event(scope: str, value: Term) -> Event:
    return Event(_Inst(f"jit(f)/{scope}/op"), [value])


def _programs(minus_signs: int, partner: bool = True) -> tuple[Programs, Term]:
    """Layer 0 computes h = tanh(x) on both sides; layer 1's reference computes exp(h), its device
    exp(-...-h) with `minus_signs` negations, which no rule cancels. The stated partner of the
    device value is what the signs leave (exp(h) or exp(-h)) computed on two windows of h and
    joined: true, and the rules reach the reference's exp(h) only through it."""
    ev = Evaluator(None, TermTable(), 1)
    t = ev.table
    x = t.make("param", (0,), (), (4,), "f32")
    h = t.make("unary", ("tanh",), (x,), (4,), "f32")
    r = t.make("unary", ("exponential",), (h,), (4,), "f32")

    def signed(v: Term, signs: int) -> Term:
        for _ in range(signs):
            v = t.make("unary", ("negate",), (v,), v.shape, "f32")
        return t.make("unary", ("exponential",), (v,), v.shape, "f32")

    device = signed(h, minus_signs)
    if partner:
        halves = [signed(t.make("slice", (0, lo, lo + 2), (h,), (2,), "f32"), minus_signs % 2) for lo in (0, 2)]
        ev.equal_terms.append([device, t.make("concat", (0,), tuple(halves), (4,), "f32")])
    programs = Programs(
        params=[x],
        reference_outputs=[r],
        device_outputs=[[device]],
        targets=[[r]],
        reference_events=[_event("layers_0", h), _event("layers_1", r)],
        distributed_events=[_event("layers_0", h), _event("layers_1", device)],
        evaluator=ev,
    )
    return programs, device


def _layering(programs: Programs) -> Layering:
    layering = split(
        programs.reference_events,
        programs.distributed_events,
        programs.reference_outputs,
        programs.device_outputs,
        programs.targets,
    )
    assert layering is not None and [s.name for s in layering.segments] == ["layers_0", "layers_1"]
    return layering


def _prove(programs: Programs):
    layering = _layering(programs)
    return prove_layers(programs, layering, Memo(None)), layering


def test_a_partner_outside_the_layer_that_reaches_into_the_previous_one_proves_it() -> None:
    programs, _ = _programs(minus_signs=2)
    proof, layering = _prove(programs)
    assert [o.proved for o in proof.layers] == [True, True]
    assert proof.all_proved
    # none of the partner's own terms is a term of any layer; its windows are of layer 0's value
    partner = programs.evaluator.equal_terms[0][1]
    assert all(t not in layering.label for t in (partner, *partner.args))
    assert layering.label[partner.args[0].args[0].args[0]] == "layers_0"  # exp(h[0:2]): h


def test_without_the_partner_the_layer_is_not_proved() -> None:
    proof, _ = _prove(_programs(minus_signs=2, partner=False)[0])
    assert [o.proved for o in proof.layers] == [True, False]


def test_a_partner_of_a_value_that_differs_does_not_prove_it() -> None:
    # exp(-h) with its true partner exp(-h[0:2]) | exp(-h[2:4]): brought in, and no proof that
    # exp(-h) is exp(h)
    proof, _ = _prove(_programs(minus_signs=1)[0])
    assert [o.proved for o in proof.layers] == [True, False]


def test_layers_share_a_proof_only_when_their_partners_are_the_same() -> None:
    """The canonical form covers the partners brought in: two layers with the same terms and
    different partners (here exp(h) and exp(-h), only the forms are compared) must not share a
    cached proof."""
    forms = []
    for other_partner in (False, True):
        programs, device = _programs(minus_signs=2)
        if other_partner:
            t = programs.evaluator.table
            h = programs.reference_events[0].values[0]
            neg = t.make("unary", ("negate",), (t.make("slice", (0, 0, 4), (h,), (4,), "f32"),), (4,), "f32")
            programs.evaluator.equal_terms[0] = [device, t.make("unary", ("exponential",), (neg,), (4,), "f32")]
        layering = _layering(programs)
        segment = layering.segments[1]
        index = _ModelIndex(list(programs.params), programs.evaluator.equal_terms)
        abstraction = _Abstraction(programs, layering, segment.name, {}, {})
        forms.append(_Problem.of(segment, programs, abstraction, index).form.digest)
    assert forms[0] != forms[1]


def _programs_through_another_value() -> tuple[Programs, Term]:
    """As `_programs(2)`, but the device value's partner takes its windows of q, a second value of
    layer 0 that layer 1 does not read, stated equal to h beside it: the layer is proved only with
    facts that reach a value it does not read."""
    programs, device = _programs(minus_signs=2, partner=False)
    ev, t = programs.evaluator, programs.evaluator.table
    h = programs.reference_events[0].values[0]
    q = t.make("unary", ("sine",), (t.make("unary", ("tanh",), (h,), (4,), "f32"),), (4,), "f32")
    ev.equal_terms.append([q, h])  # stands for a fact the translator found (no rule derives it)
    halves = [
        t.make("unary", ("exponential",), (t.make("slice", (0, lo, lo + 2), (q,), (2,), "f32"),), (2,), "f32")
        for lo in (0, 2)
    ]
    ev.equal_terms.append([device, t.make("concat", (0,), tuple(halves), (4,), "f32")])
    programs.reference_events.insert(1, _event("layers_0", q))
    return programs, device


class _CountingMemo(Memo):
    def __init__(self) -> None:
        super().__init__(None)
        self.proved: list[str] = []

    def put(self, kind, k, value) -> None:
        self.proved.append(k)
        super().put(kind, k, value)


def test_a_layer_is_proved_first_with_its_own_facts_and_again_with_all_where_those_do_not_suffice() -> None:
    programs, _ = _programs_through_another_value()
    memo = _CountingMemo()
    proof = prove_layers(programs, _layering(programs), memo)
    assert [o.proved for o in proof.layers] == [True, True]
    assert len(memo.proved) == 3  # layer 0 once; layer 1 without the facts about q, then with them


def test_without_the_second_value_stated_equal_the_layer_is_not_proved() -> None:
    programs, _ = _programs_through_another_value()
    programs.evaluator.equal_terms.pop(0)
    assert [o.proved for o in _prove(programs)[0].layers] == [True, False]
