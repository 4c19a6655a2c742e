"""Findings on the line a reviewer would change, on small models written for the purpose.

- An op that takes another element type than the reference's op of the same kind (integer positions
  cast to bfloat16 where the reference casts the angles) is not that op with work missing before it:
  the cast is the finding, not the line that made the (correct) positions.
- A window of a value every device computes whole (routing weights) cut at offsets that do not tile
  it in device order (`axis_index` where `axis_index * experts_per_device` is meant): the slice that
  cut it is the finding, not the matmul that combines it with the device's experts.
- `k = x @ w[:, 0]` written below `q = x @ w[:, 0]`: the compiler merges the two computations and
  keeps q's line; the line in `k`'s chain of assignments that computes the same expression is the
  finding (`k = ...` itself, or `wk = w[:, 0]` used by `k = x @ wk`). Near miss: the same slice
  written another way (`lax.index_in_dim`) is merged too, but no line of `k`'s chain shows the
  same expression, so nothing claims a merge.
- An extra `sin` on a per-device slice of the weight: the op that makes the wrong value is the
  finding, and no "wrong window" is claimed at the (correct) slice upstream of it. (The localizer
  claims a wrong window only where a value is a slice of another reference value; this model
  reaches the `sin` as the first unrelated op, not through that branch.)"""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status


def package(tmp_path_factory, module: str, source: str, reference: str, mesh: str, models: dict[str, str]):
    """A one-module package and its manifest: model name -> distributed entrypoint of `module`."""
    manifest = "version: 1\nmodels:\n" + "".join(
        f"  - {{name: {name}, reference: {module}:{reference}, distributed: {module}:{func}, inputs: {module}:inputs, "
        f"mesh: {{{mesh}}}}}\n"
        for name, func in models.items()
    )
    return write_package(tmp_path_factory.mktemp(module.removesuffix(".py")), module, source, manifest)


MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    f32, bf16 = jnp.float32, jnp.bfloat16
    SEQ, DIM = 512, 4


    def inputs():
        return (jax.ShapeDtypeStruct((SEQ, DIM), f32),)


    def inv_freq():
        return 1.0 / (100.0 ** (jnp.arange(DIM).astype(f32) / DIM))


    def rotate(x):
        ang = jnp.arange(SEQ).astype(f32)[:, None] * inv_freq()[None, :]
        return (x * jnp.cos(ang)).astype(bf16)


    def rotate_sp(x, *, mesh):
        def dev(x):
            n = x.shape[0]
            pos = lax.axis_index("sp") * n + jnp.arange(n)
            ang = pos.astype(f32)[:, None] * inv_freq()[None, :]
            return (x * jnp.cos(ang)).astype(bf16)

        return jax.shard_map(dev, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)


    def rotate_sp_bf16_positions(x, *, mesh):
        def dev(x):
            n = x.shape[0]
            pos = lax.axis_index("sp") * n + jnp.arange(n)
            ang = pos.astype(bf16)[:, None] * inv_freq().astype(bf16)[None, :]  # MARK:cast
            return (x * jnp.cos(ang.astype(f32))).astype(bf16)

        return jax.shard_map(dev, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)
    """
).lstrip()


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return package(
        tmp_path_factory,
        "model.py",
        MODEL,
        "rotate",
        "sp: 2",
        {"ok": "rotate_sp", "bf16-positions": "rotate_sp_bf16_positions"},
    )


def test_positions_cast_in_float32_verify(manifest):
    assert verify_named(manifest, "ok").status == Status.VERIFIED


def test_positions_cast_to_bfloat16_blame_the_cast_not_the_positions(manifest):
    result = verify_named(manifest, "bf16-positions")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "cast")), result.findings
    assert "the reference applies" not in lead.message  # no work is missing: the positions are right


ROUTED = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    f32 = jnp.float32
    T, D, E = 8, 4, 8


    def inputs():
        return jax.ShapeDtypeStruct((T, D), f32), jax.ShapeDtypeStruct((D, E), f32), jax.ShapeDtypeStruct((E, D), f32)


    def mixture(x, router, experts):
        return jax.nn.softmax(x @ router, axis=-1) @ experts


    def mixture_ep(x, router, experts, *, mesh):
        def shard(x, router, experts):
            n = experts.shape[0]
            weights = jax.nn.softmax(x @ router, axis=-1)
            mine = lax.dynamic_slice_in_dim(weights, lax.axis_index("ep") * n, n, axis=1)
            return lax.psum(mine @ experts, "ep")

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(), P("ep")), out_specs=P())(x, router, experts)


    def mixture_ep_unscaled_offset(x, router, experts, *, mesh):
        def shard(x, router, experts):
            n = experts.shape[0]
            weights = jax.nn.softmax(x @ router, axis=-1)
            mine = lax.dynamic_slice_in_dim(weights, lax.axis_index("ep"), n, axis=1)  # MARK:slice
            return lax.psum(mine @ experts, "ep")

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(), P("ep")), out_specs=P())(x, router, experts)
    """
).lstrip()


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    return package(
        tmp_path_factory,
        "routed.py",
        ROUTED,
        "mixture",
        "ep: 4",
        {"ok": "mixture_ep", "offset": "mixture_ep_unscaled_offset"},
    )


def test_weights_sliced_at_the_scaled_offset_verify(routed):
    assert verify_named(routed, "ok").status == Status.VERIFIED


def test_weights_sliced_at_an_unscaled_offset_blame_the_slice(routed):
    result = verify_named(routed, "offset")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("routed.py", line_of(ROUTED, "slice")), result.findings
    assert "`weights` along dim 1 takes [0:2), [1:3), [2:4), [3:5)" in lead.message, lead.message


FUSED = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    f32 = jnp.float32
    S, D, F = 8, 4, 8


    def inputs():
        return jax.ShapeDtypeStruct((S, D), f32), jax.ShapeDtypeStruct((D, 3, F), f32)


    def attention(x, w):
        return jnp.einsum("sf,tf->st", x @ w[:, 0], x @ w[:, 1])


    def _sharded(body, x, w, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, "tp")), out_specs=P())(x, w)


    def attention_tp(x, w, *, mesh):
        def body(x, w):
            q = x @ w[:, 0]
            k = x @ w[:, 1]
            return lax.psum(jnp.einsum("sf,tf->st", q, k), "tp")

        return _sharded(body, x, w, mesh)


    def attention_tp_k_from_q(x, w, *, mesh):
        def body(x, w):
            q = x @ w[:, 0]
            k = x @ w[:, 0]  # MARK:k
            return lax.psum(jnp.einsum("sf,tf->st", q, k), "tp")

        return _sharded(body, x, w, mesh)


    def attention_tp_k_weight_from_q(x, w, *, mesh):
        def body(x, w):
            q = x @ w[:, 0]
            wk = w[:, 0]  # MARK:wk
            k = x @ wk
            return lax.psum(jnp.einsum("sf,tf->st", q, k), "tp")

        return _sharded(body, x, w, mesh)


    def attention_tp_k_weight_indexed_from_q(x, w, *, mesh):
        def body(x, w):
            q = x @ w[:, 0]
            wk = lax.index_in_dim(w, 0, axis=1, keepdims=False)
            k = x @ wk
            return lax.psum(jnp.einsum("sf,tf->st", q, k), "tp")

        return _sharded(body, x, w, mesh)
    """
).lstrip()


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    return package(
        tmp_path_factory,
        "fused.py",
        FUSED,
        "attention",
        "tp: 2",
        {
            "ok": "attention_tp",
            "k-from-q": "attention_tp_k_from_q",
            "k-weight-from-q": "attention_tp_k_weight_from_q",
            "k-weight-indexed-from-q": "attention_tp_k_weight_indexed_from_q",
        },
    )


def test_fused_projection_read_in_the_right_parts_verifies(fused):
    assert verify_named(fused, "ok").status == Status.VERIFIED


def test_k_computed_like_q_blames_the_line_that_binds_k(fused):
    result = verify_named(fused, "k-from-q")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("fused.py", line_of(FUSED, "k")), result.findings
    assert "`k` gets its value from this line" in lead.message and "merged" in lead.message


def test_a_weight_cut_like_q_s_blames_the_line_that_cuts_it(fused):
    result = verify_named(fused, "k-weight-from-q")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("fused.py", line_of(FUSED, "wk")), result.findings
    assert "merged" in lead.message


def test_near_miss_the_same_slice_written_otherwise_claims_no_merge(fused):
    result = verify_named(fused, "k-weight-indexed-from-q")
    assert result.status == Status.MISMATCH
    assert "merged" not in result.findings[0].message, result.findings


SLICED = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    f32 = jnp.float32
    T, D, H = 4, 8, 16


    def inputs():
        return jax.ShapeDtypeStruct((T, D), f32), jax.ShapeDtypeStruct((D, H), f32), jax.ShapeDtypeStruct((H, D), f32)


    def mlp(x, w_up, w_down):
        return jnp.tanh(x @ w_up) @ w_down


    def mlp_tp(x, w_up, w_down, *, mesh):
        def shard(x, w_up, w_down):
            n = w_down.shape[0]
            cols = lax.dynamic_slice_in_dim(w_up, lax.axis_index("tp") * n, n, axis=1)
            return lax.psum(jnp.tanh(x @ cols) @ w_down, "tp")

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(), P("tp")), out_specs=P())(x, w_up, w_down)


    def mlp_tp_sin(x, w_up, w_down, *, mesh):
        def shard(x, w_up, w_down):
            n = w_down.shape[0]
            cols = lax.dynamic_slice_in_dim(w_up, lax.axis_index("tp") * n, n, axis=1)
            h = jnp.sin(x @ cols)  # MARK:sin
            return lax.psum(h @ w_down, "tp")

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(), P("tp")), out_specs=P())(x, w_up, w_down)
    """
).lstrip()


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    return package(tmp_path_factory, "sliced.py", SLICED, "mlp", "tp: 2", {"ok": "mlp_tp", "sin": "mlp_tp_sin"})


def test_weight_columns_sliced_per_device_verify(sliced):
    assert verify_named(sliced, "ok").status == Status.VERIFIED


def test_a_value_that_is_a_slice_of_nothing_claims_no_wrong_window(sliced):
    result = verify_named(sliced, "sin")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert "wrong window" not in lead.message, result.findings
    assert (lead.path, lead.line) == ("sliced.py", line_of(SLICED, "sin")), result.findings
