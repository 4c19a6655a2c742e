"""What the implementation styles of bench/styles/ share: the shapes they are measured at and
the entrypoints the benchmark's manifest names (forward_<cfg>, forward_<cfg>_tp, inputs_<cfg>).

A style module defines `reference(cfg, *args)`, `distributed(cfg, *args, mesh)` and
`inputs(cfg, dtype)`, then calls `export(globals(), ...)`. The modules are copied next to
bench/llama_tp.py (whose pieces they reuse, as teams reuse their own model code) into the
benchmark's repository, so they import it as a sibling.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from llama_tp import LLAMA_8B, LLAMA_70B, LLAMA_405B, Config

# A size at which the programs run for real: the numeric check (bench/check_styles.py).
TINY = Config(d_model=64, n_layers=2, n_heads=16, n_kv_heads=8, d_ff=128, vocab=256)
CONFIGS = {"tiny": TINY, "8b": LLAMA_8B, "70b": LLAMA_70B, "405b": LLAMA_405B}

# Weights and activations as large models store them.
BF16 = jnp.bfloat16


def export(namespace: dict, reference, distributed, inputs, dtype=BF16) -> None:
    """Bind every shape: forward_<cfg> (reference), forward_<cfg>_tp (distributed, takes mesh=)
    and inputs_<cfg>() for each name in CONFIGS."""
    for name, cfg in CONFIGS.items():
        namespace[f"forward_{name}"] = functools.partial(reference, cfg)
        namespace[f"forward_{name}_tp"] = functools.partial(distributed, cfg)
        namespace[f"inputs_{name}"] = functools.partial(inputs, cfg, dtype)
