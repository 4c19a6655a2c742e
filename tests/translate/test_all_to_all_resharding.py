"""all_to_all resharding between sequence and head shards (Ulysses attention), as terms.

The fact: HLO `all-to-all` along dim s over a group of N gives device d the concatenation, in group
order, of chunk d (along s) of every member's operand; JAX's split_axis != concat_axis form is that
one-dim all-to-all with a reshape, transpose, reshape around it. So if device k holds window k of a
value R along dim a, after all_to_all(split=b, concat=a) device d holds all of R along a and window
d along b (equivci.translate.relaid: the received blocks, whatever each member did to its value
first, read on labels; Builder.concat: blocks transposed alike are their join transposed).

Checked on the terms the builder makes (values against numpy's all-to-all), on hand-written HLO of
the tuple form (values), and on JAX programs in several styles (tiled and not, a merged [S, H*D]
head dim, a 2-D mesh) that verify, with near misses (split and concat dims swapped, the received
blocks in the wrong order) that must be `mismatch`.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(13)


def _a2a(ev: Evaluator, members: list, device: int, split: int, concat: int):
    """What HLO gives device `device` for JAX's all_to_all(split, concat, tiled=True): the one-dim
    all-to-all along `split` (each member's chunk `device`, joined along split), then the view
    [.., N, chunk, ..], the group dim moved before `concat`, and the merge."""
    n = len(members)
    chunk = members[0].shape[split] // n
    joined = ev.concat([ev.slice_term(m, split, device * chunk, (device + 1) * chunk) for m in members], split)
    grid = list(joined.shape[:split]) + [n, chunk] + list(joined.shape[split + 1 :])
    split_view = ev.reshape_term(joined, Shape("f32", tuple(grid)))
    order = list(range(len(grid)))
    group = order.pop(split)
    order.insert(concat, group)
    moved = ev.transpose_term(split_view, tuple(order))
    out = list(members[0].shape)
    out[split] //= n
    out[concat] *= n
    return ev.reshape_term(moved, Shape("f32", tuple(out)))


def _numpy_a2a(values: list[np.ndarray], device: int, split: int, concat: int) -> np.ndarray:
    n = len(values)
    return np.concatenate([np.split(v, n, axis=split)[device] for v in values], axis=concat)


@pytest.mark.parametrize(("split", "concat"), [(1, 0), (0, 1)])
def test_blocks_of_transposed_members_are_joined_along_the_concat_dim(split, concat) -> None:
    """Each member holds a transposed value (an attention output laid out [s, h, e] from [h, e, s]):
    the resharded value is the join of the members' blocks along the concat dim, and evaluates to
    numpy's all-to-all."""
    ev = Evaluator(None, TermTable(), 1)
    raw = [ev.table.make("param", (k,), (), (4, 2, 8), "f32") for k in range(4)]  # [h, e, s]
    members = [ev.transpose_term(r, (2, 0, 1)) for r in raw]  # [s, h, e] = [8, 4, 2]
    values = {k: RNG.standard_normal((4, 2, 8)).astype(np.float32) for k in range(4)}
    for device in range(4):
        term = _a2a(ev, members, device, split, concat)
        want = _numpy_a2a([values[k].transpose(2, 0, 1) for k in range(4)], device, split, concat)
        np.testing.assert_array_equal(evaluate(term, values), want)
        assert term.op in ("concat", "transpose"), term.op  # no reshape of a transpose left


def test_blocks_transposed_differently_are_joined_as_written() -> None:
    """Only blocks transposed alike are their join transposed: a join of two transposes by
    different permutations keeps its form (and values)."""
    ev = Evaluator(None, TermTable(), 1)
    a, b = (ev.table.make("param", (k,), (), (2, 2, 2), "f32") for k in range(2))
    term = ev.concat([ev.transpose_term(a, (1, 0, 2)), ev.transpose_term(b, (0, 2, 1))], 0)
    values = {k: RNG.standard_normal((2, 2, 2)).astype(np.float32) for k in range(2)}
    want = np.concatenate([values[0].transpose(1, 0, 2), values[1].transpose(0, 2, 1)])
    np.testing.assert_array_equal(evaluate(term, values), want)


def test_windows_of_one_value_resharded_are_its_window() -> None:
    """Members that hold windows k of one value R along dim 0: after the all-to-all device d holds
    R's window d along dim 1, all of dim 0 (the relational form of the fact)."""
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (8, 4, 3), "f32")
    members = [ev.slice_term(whole, 0, 2 * k, 2 * k + 2) for k in range(4)]
    for device in range(4):
        term = _a2a(ev, members, device, 1, 0)
        assert term.op == "slice" and term.args[0] is whole and term.attrs == (1, device, device + 1), term


def test_blocks_joined_in_another_order_are_no_window() -> None:
    """The received blocks reversed before the view: the labels show no window of R."""
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (8, 4, 3), "f32")
    members = [ev.slice_term(whole, 0, 2 * k, 2 * k + 2) for k in range(4)]
    term = _a2a(ev, members[::-1], 1, 1, 0)
    value = RNG.standard_normal((8, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(
        evaluate(term, {0: value}), np.concatenate([value[2 * k : 2 * k + 2, 1:2] for k in range(3, -1, -1)])
    )
    assert not (term.op == "slice" and term.args[0] is whole)


TUPLE_A2A = """HloModule m

ENTRY main {
  x = f32[2,3]{1,0} parameter(0)
  a = f32[1,3]{1,0} slice(x), slice={[0:1], [0:3]}
  b = f32[1,3]{1,0} slice(x), slice={[1:2], [0:3]}
  t = (f32[1,3]{1,0}, f32[1,3]{1,0}) all-to-all(a, b), channel_id=1, replica_groups={{0,1}}
  p = f32[1,3]{1,0} get-tuple-element(t), index=0
  q = f32[1,3]{1,0} get-tuple-element(t), index=1
  ROOT c = f32[2,3]{1,0} concatenate(p, q), dimensions={0}
}
"""


def test_the_tuple_all_to_all_sends_operand_k_to_member_k() -> None:
    """HLO's tuple form: operand k of each member goes to member k, which receives them as its
    outputs in group order."""
    module = parse_module(TUPLE_A2A)
    table = TermTable()
    ev = Evaluator(module, table, 2)
    params = [table.make("param", (d,), (), (2, 3), "f32") for d in range(2)]
    values = {d: RNG.standard_normal((2, 3)).astype(np.float32) for d in range(2)}
    for d, result in enumerate(ev.run(module.entry, [params])):
        want = np.concatenate([values[0][d : d + 1], values[1][d : d + 1]])
        np.testing.assert_array_equal(evaluate(result, values), want)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, H, E = 2, 8, 8, 3


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, S, H, E), f(E, E)


    def mix(x, w):
        # per head, every position reads the whole sequence (a causal prefix sum of x @ w)
        y = jnp.einsum("bshe,ef->bshf", x, w)
        return jnp.einsum("ts,bshf->bthf", jnp.tril(jnp.ones((S, S), x.dtype)), y)


    def _ulysses(x, w, mesh, to_heads, to_seq, spec=P(None, "sp")):
        def body(x, w):
            return to_seq(mix(to_heads(x), w))

        return jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec)(x, w)


    def tiled(x, w, *, mesh):
        heads = lambda t: lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)
        seq = lambda t: lax.all_to_all(t, "sp", split_axis=1, concat_axis=2, tiled=True)
        return _ulysses(x, w, mesh, heads, seq)


    def untiled(x, w, *, mesh):
        # tiled=False: the split dim is viewed [N, H/N] and the group dim comes out where it is concatenated
        def heads(t):
            b, s, h, e = t.shape
            t = lax.all_to_all(t.reshape(b, s, 4, h // 4, e), "sp", split_axis=2, concat_axis=1, tiled=False)
            return t.reshape(b, 4 * s, h // 4, e)

        def seq(t):
            b, s, h, e = t.shape
            t = lax.all_to_all(t.reshape(b, 4, s // 4, h, e), "sp", split_axis=1, concat_axis=2, tiled=False)
            return t.reshape(b, s // 4, 4 * h, e)

        return _ulysses(x, w, mesh, heads, seq)


    def merged_heads(x, w, *, mesh):
        # heads and head dim merged, [B, S, H*E], split on the merged dim
        def heads(t):
            b, s, h, e = t.shape
            t = lax.all_to_all(t.reshape(b, s, h * e), "sp", split_axis=2, concat_axis=1, tiled=True)
            return t.reshape(b, 4 * s, h // 4, e)

        def seq(t):
            b, s, h, e = t.shape
            t = lax.all_to_all(t.reshape(b, s, h * e), "sp", split_axis=1, concat_axis=2, tiled=True)
            return t.reshape(b, s // 4, 4 * h, e)

        return _ulysses(x, w, mesh, heads, seq)


    def two_dim_mesh(x, w, *, mesh):
        heads = lambda t: lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)
        seq = lambda t: lax.all_to_all(t, "sp", split_axis=1, concat_axis=2, tiled=True)
        return _ulysses(x, w, mesh, heads, seq, P("dp", "sp"))


    def swapped_back(x, w, *, mesh):
        heads = lambda t: lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)
        seq = lambda t: lax.all_to_all(t, "sp", split_axis=1, concat_axis=3, tiled=True)  # MARK:swapped
        return _ulysses(x, w, mesh, heads, lambda t: seq(t).reshape(t.shape[0], -1, 4 * t.shape[2], t.shape[3]))


    def blocks_reversed(x, w, *, mesh):
        def heads(t):
            t = lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)
            b, s, h, e = t.shape
            return jnp.flip(t.reshape(b, 4, s // 4, h, e), axis=1).reshape(b, s, h, e)  # MARK:reversed

        seq = lambda t: lax.all_to_all(t, "sp", split_axis=1, concat_axis=2, tiled=True)
        return _ulysses(x, w, mesh, heads, seq)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: tiled, reference: m.py:mix, distributed: m.py:tiled, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: untiled, reference: m.py:mix, distributed: m.py:untiled, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: merged-heads, reference: m.py:mix, distributed: m.py:merged_heads, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: two-dim-mesh, reference: m.py:mix, distributed: m.py:two_dim_mesh, inputs: m.py:inputs,
         mesh: {dp: 2, sp: 4}}
      - {name: swapped-back, reference: m.py:mix, distributed: m.py:swapped_back, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: blocks-reversed, reference: m.py:mix, distributed: m.py:blocks_reversed, inputs: m.py:inputs,
         mesh: {sp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("ulysses"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["tiled", "untiled", "merged-heads", "two-dim-mesh"])
def test_sequence_to_heads_and_back_verifies(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["swapped-back", "blocks-reversed"])
def test_a_wrong_resharding_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
