"""An op of code both programs run (a stage function the pipeline reaches through lax.switch) is
handed what the distributed program's schedule feeds it; when no op of the distributed program's own
code makes that value otherwise, a static choice the call into the shared code reads (the tick count
a callback computes, bound through the loop `for t in range(ticks(m, n))`) is the line to change."""

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

    M = 4
    D = 8
    F = 16


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        return {"w1": f(4, D, F), "b1": f(4, F), "w2": f(4, F, D), "b2": f(4, D)}, f(16, D)


    def _in_proj(p, x):
        return jnp.tanh(x @ p["w1"][:, :D] + p["b1"][:D])


    def _mlp(p, x):
        return x + jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


    def _head(p, x):
        return x @ p["w2"][:D] + p["b2"]


    BRANCHES = (_in_proj, _mlp, _mlp, _head)


    def stages(p, x):
        for s, fn in enumerate(BRANCHES):
            x = fn(jax.tree_util.tree_map(lambda a: a[s], p), x)
        return x


    def _local(p, x, ticks):
        mine = {k: v[0] for k, v in p.items()}
        last = lax.axis_size("pp") - 1
        me = lax.axis_index("pp")
        chunks = jnp.split(x, M)
        carry, finished = jnp.zeros_like(chunks[0]), []
        for tick in range(ticks(M, last + 1)):
            entering = chunks[tick] if tick < M else jnp.zeros_like(chunks[0])
            carry = lax.switch(me, BRANCHES, mine, jnp.where(me == 0, entering, carry))
            if tick >= last:
                finished.append(jnp.where(me == last, carry, 0.0))
            carry = lax.ppermute(carry, "pp", [(k, k + 1) for k in range(last)])
        finished += [jnp.zeros_like(chunks[0])] * (M - len(finished))
        return lax.psum(jnp.concatenate(finished), "pp")


    def _ticks(m, n):
        return m + n - 1


    def _ticks_short(m, n):
        return m + n - 2  # MARK:short


    def _run(p, x, mesh, ticks):
        local = lambda p, x: _local(p, x, ticks)  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(), check_vma=False)(p, x)


    def pipeline(p, x, *, mesh):
        return _run(p, x, mesh, _ticks)


    def pipeline_short(p, x, *, mesh):
        return _run(p, x, mesh, _ticks_short)
    """
).lstrip()

MANIFEST = (
    "version: 1\nmodels:\n"
    "  - {name: right, reference: model.py:stages, distributed: model.py:pipeline, inputs: model.py:inputs, mesh: {pp: 4}}\n"
    "  - {name: short, reference: model.py:stages, distributed: model.py:pipeline_short, inputs: model.py:inputs, "
    "mesh: {pp: 4}}\n"
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("schedule_choice"), "model.py", MODEL, MANIFEST)


@pytest.mark.slow  # a four-stage pipeline unrolled over seven ticks: about 25 s
def test_the_tick_count_the_schedule_is_given_leads(manifest):
    result = verify_named(manifest, "short")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "short"), "error"), lead
