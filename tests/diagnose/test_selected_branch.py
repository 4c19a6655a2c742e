"""A flag that selects which of two pieces of code a helper runs: where the op that differs is in
the piece the flag selected (a branch of an `if` testing it, or a conditional expression on it),
that piece is written wrong and the finding stays there; the call that passes the flag follows as
a tied note. Near miss: a flag whose branch is skipped (work left out) leads at the call (the
`clip` flag of tests/diagnose/test_caller_choice.py; here `norm`)."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    SPECS = (P(), P(None, "model"), P("model", None))


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 32), f), jax.ShapeDtypeStruct((32, 16), f)


    def mlp(x, w_up, w_down):
        h = jax.nn.relu(x @ w_up)
        return h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + 1.0) @ w_down


    def _branch(leaky, norm):
        def local(x, w_up, w_down):
            h = x @ w_up
            if leaky:
                h = jnp.where(h > 0, h, 0.1 * h)  # MARK:branch
            else:
                h = jax.nn.relu(h)
            if norm:
                h = h / jnp.sqrt(lax.psum(jnp.sum(h * h, -1, keepdims=True), "model") / 32 + 1.0)
            return lax.psum(h @ w_down, "model")
        return local


    def _ifexp(leaky):
        def local(x, w_up, w_down):
            h = x @ w_up
            h = jnp.where(h > 0, h, 0.1 * h) if leaky else jax.nn.relu(h)  # MARK:ifexp
            h = h / jnp.sqrt(lax.psum(jnp.sum(h * h, -1, keepdims=True), "model") / 32 + 1.0)
            return lax.psum(h @ w_down, "model")
        return local


    def _run(local, x, w_up, w_down, mesh):
        return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def tp(x, w_up, w_down, mesh):
        return _run(_branch(False, True), x, w_up, w_down, mesh)


    def tp_leaky(x, w_up, w_down, mesh):
        return _run(_branch(True, True), x, w_up, w_down, mesh)  # MARK:leaky-call


    def tp_unnormed(x, w_up, w_down, mesh):
        return _run(_branch(False, False), x, w_up, w_down, mesh)  # MARK:norm-call


    def tp_ifexp(x, w_up, w_down, mesh):
        return _run(_ifexp(False), x, w_up, w_down, mesh)


    def tp_ifexp_leaky(x, w_up, w_down, mesh):
        return _run(_ifexp(True), x, w_up, w_down, mesh)  # MARK:ifexp-call
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:mlp, distributed: model.py:{name.replace('-', '_')}, "
    "inputs: model.py:inputs, mesh: {model: 2}}\n"
    for name in ["tp", "tp-leaky", "tp-unnormed", "tp-ifexp", "tp-ifexp-leaky"]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("selected_branch"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["tp", "tp-ifexp"])
def test_near_miss_the_other_branch_is_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


@pytest.mark.parametrize(
    ("name", "op", "call"), [("tp-leaky", "branch", "leaky-call"), ("tp-ifexp-leaky", "ifexp", "ifexp-call")]
)
def test_the_selected_branch_leads_and_the_call_follows(manifest, name, op, call):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, op), "error"), result.findings
    notes = [f for f in result.findings if (f.line, f.severity) == (line_of(MODEL, call), "note")]
    assert notes and "which selects the code the finding" in notes[0].message and notes[0].tie == lead.tie


def test_near_miss_a_skipped_branch_leads_at_the_call(manifest):
    result = verify_named(manifest, "tp-unnormed")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "norm-call")), result.findings
