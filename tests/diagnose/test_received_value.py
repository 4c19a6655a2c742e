"""A value made right in code both programs run (a reference value, or a share of one) whose fault
is what the distributed program does after it: the finding leads where the distributed program
receives it, never at what the shared code was handed (that holds for a shared op whose value
differs, tests/diagnose/test_handed_value.py). A residual add left out after a shared FFN leads at
the statement that calls it; a partial sum returned through a callable the caller passes leads at
the call passing the no-op (`lambda y: y`, where another call passes a psum). An all-reduce over the
wrong mesh axis leads where the axis is written: a `functools.partial(lax.psum, axis_name=...)`
bound in the body and handed to a module instance's `__call__`. Near misses verify."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, F = 8, 16, 32


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, F), f), jax.ShapeDtypeStruct((F, D), f)


    def norm(x):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


    class Down:
        def __call__(self, h, w, reduce=lambda y: y):
            return reduce(h @ w)  # MARK:down


    down = Down()


    def ffn(x, w_up, w_down, reduce=lambda y: y):
        return down(jnp.tanh(x @ w_up), w_down, reduce=reduce)


    def block(x, w_up, w_down):
        h = x + ffn(norm(x), w_up, w_down)
        h = h + ffn(norm(h), w_up, w_down)
        return h + ffn(norm(h), w_up, w_down)


    def _tp(body, x, w_up, w_down, mesh):
        specs = (P(), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def block_tp(x, w_up, w_down, *, mesh):
        def body(x, w_up, w_down):
            psum = functools.partial(lax.psum, axis_name="model")
            h = x + ffn(norm(x), w_up, w_down, psum)
            h = h + ffn(norm(h), w_up, w_down, psum)
            return h + ffn(norm(h), w_up, w_down, psum)

        return _tp(body, x, w_up, w_down, mesh)


    def block_tp_no_residual(x, w_up, w_down, *, mesh):
        def body(x, w_up, w_down):
            psum = functools.partial(lax.psum, axis_name="model")
            h = x + ffn(norm(x), w_up, w_down, psum)
            h = ffn(norm(h), w_up, w_down, psum)  # MARK:no-residual
            return h + ffn(norm(h), w_up, w_down, psum)

        return _tp(body, x, w_up, w_down, mesh)


    def block_tp_wrong_axis(x, w_up, w_down, *, mesh):
        def body(x, w_up, w_down):
            psum = functools.partial(lax.psum, axis_name="data")  # MARK:axis
            h = x + ffn(norm(x), w_up, w_down, psum)
            h = h + ffn(norm(h), w_up, w_down, psum)
            return h + ffn(norm(h), w_up, w_down, psum)

        return _tp(body, x, w_up, w_down, mesh)


    def mlp(x, w_up, w_down):
        return ffn(x, w_up, w_down)


    def _mlp_tp(combine, x, w_up, w_down, mesh):
        return _tp(lambda x, u, d: combine(ffn(x, u, d)), x, w_up, w_down, mesh)


    def mlp_tp(x, w_up, w_down, *, mesh):
        return _mlp_tp(lambda y: lax.psum(y, "model"), x, w_up, w_down, mesh)


    def mlp_tp_uncombined(x, w_up, w_down, *, mesh):
        return _mlp_tp(lambda y: y, x, w_up, w_down, mesh)  # MARK:uncombined
    """
).lstrip()

MANIFEST = manifest_text(
    [
        ("block", "block", "block_tp"),
        ("no-residual", "block", "block_tp_no_residual"),
        ("wrong-axis", "block", "block_tp_wrong_axis"),
        ("mlp", "mlp", "mlp_tp"),
        ("uncombined", "mlp", "mlp_tp_uncombined"),
    ],
    "{data: 2, model: 2}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("received_value"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["block", "mlp"])
def test_near_miss_the_correct_programs_verify(manifest, name):
    assert verify_named(manifest, name).status == Status.VERIFIED


@pytest.mark.parametrize(
    ("name", "mark", "says"),
    [
        ("no-residual", "no-residual", "the reference applies `add` here"),
        ("uncombined", "uncombined", "`lambda y: y` is passed here as `combine` of `_mlp_tp`"),
        ("wrong-axis", "axis", "the mesh axes ('data') that the `all-reduce` at model.py:"),
    ],
    ids=["no-residual", "uncombined", "wrong-axis"],
)
def test_the_line_that_receives_or_sets_the_value_leads(manifest, name, mark, says):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, mark), "error"), result.findings
    assert says in lead.message
