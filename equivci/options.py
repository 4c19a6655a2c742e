"""The settings of a run that come from the environment, read once (`Options.from_env`, where a run
starts) and passed down as one frozen value; no module reads the environment at import time."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

ENV_VERIFY_TIMEOUT = "EQUIVCI_VERIFY_TIMEOUT"
ENV_VERIFY_MEMORY = "EQUIVCI_VERIFY_MEMORY"
ENV_CACHE_DIR = "EQUIVCI_CACHE_DIR"
ENV_SATURATION_ITERATIONS = "EQUIVCI_SATURATION_ITERATIONS"
SATURATION_ITERATIONS = 120
ENV_SATURATION_NODES = "EQUIVCI_SATURATION_NODES"
SATURATION_NODES = 4_000_000  # the most rows an e-graph reaches when EQUIVCI_SATURATION_NODES is unset


def _three_quarters_of_memory() -> int:
    # Leave a quarter of the machine to everything else (the numeric oracle child, the CI runner).
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.75)


@dataclasses.dataclass(frozen=True)
class Budgets:
    """The engine's size and count limits, in one place. Past one, the engine keeps a value symbolic,
    tries fewer candidates or skips a check: a proof it would have found may be missed (`unproven`),
    a verdict it gives does not depend on them. Passed down from `Options` to each stage."""

    # translate: constants folded up to this many elements (larger ones, weights-sized, stay symbolic)
    fold_elements: int = 1 << 16
    # translate: layout identities (a gather of reshaped shards, a microbatch window) checked on one
    # label per element up to this many elements
    layout_labels: int = 1 << 20
    # translate/masks: a vocab mask's rows and a lookup's indices labelled up to this many elements
    mask_labels: int = 1 << 16
    # translate/routing: index vectors the routing lemma enumerates, and the largest 3-D dot operand
    # walked back to say why a mask was not enumerated
    routing_cases: int = 1 << 12
    routing_limit_elements: int = 1 << 18
    # translate/unroll: iterations of one loop, and body instructions over all its iterations
    unroll_trips: int = 32
    unroll_instructions: int = 20_000
    # prove/layered: windows of a reference value tried as a layer's input
    layer_windows: int = 64
    # prove/candidates: reference blocks proposed as hints to a failed saturation
    window_candidates: int = 2000
    # verify: run the numeric oracle only where random inputs are cheap to draw and run on a CPU, and
    # give its child process this long
    oracle_timeout_seconds: float = 300.0
    oracle_elements: int = 1 << 22
    # verify: past this many terms a model the layers do not prove is saturated only up to its first
    # unproved layer (the whole e-graph of a 100-layer model costs minutes)
    whole_program_terms: int = 20_000
    # prove: no saturation pass starts on an e-graph of this many rows (about 350 bytes each); None:
    # a budget derived from the program (prove/saturate.py: node_budget). EQUIVCI_SATURATION_NODES.
    saturation_nodes: int | None = None
    # verify: the saturation with proposed windows is bounded tighter (the windows are pushed into the
    # reference terms a few levels deep, and where they keep the rules growing it stops early)
    hinted_iterations: int = 16
    # translate/windows: ops walked through from a window to the value that is read
    window_depth: int = 24
    # translate/constants: known constants (or their dims) a new constant is found a window of, stated
    # equal (a device's mask rows that both the causal and the sliding-window mask hold)
    constant_sources: int = 4
    # translate/bounds: values of a bounded integer that an elementwise function of it (a floor
    # modulus, a wrap of negative indices) is evaluated at to bound the function
    enumerated_values: int = 256
    # translate/elementwise: windows a select by a constant mask is split into (more: it stays a select)
    select_runs: int = 4
    # translate/shapes: runs of consecutive rows a gather at constant indices is written as (a static
    # permutation of chunks: more, a shuffle of single rows, stays a gather)
    taken_runs: int = 16
    # translate/cumsums: sums of windows' totals added in any order that are merged into one total
    window_totals: int = 16
    # translate/signed_sums: terms of a sum with subtracted terms put in one order (a longer sum keeps
    # only its written form)
    signed_terms: int = 8
    # diagnose/missing: reference ops a chain of missing work may span, reference ops visited forward
    # from one owner, and reference values tried as the owner of one operand
    missing_chain: int = 40
    missing_reached: int = 4000
    missing_owner_checks: int = 3000
    # diagnose/numeric: localization by values skipped past this many terms or input elements
    numeric_terms: int = 50_000
    numeric_elements: int = 1 << 22


@dataclasses.dataclass(frozen=True)
class Options:
    # EQUIVCI_VERIFY_TIMEOUT: the CPU seconds of one model's proof search (its child process; not the
    # wall clock, which the machine's load stretches)
    verify_timeout_seconds: float = 900.0
    verify_memory_bytes: int = dataclasses.field(default_factory=_three_quarters_of_memory)  # EQUIVCI_VERIFY_MEMORY
    cache_dir: Path | None = None  # EQUIVCI_CACHE_DIR (--cache-dir wins over it)
    # EQUIVCI_SATURATION_ITERATIONS: the least saturation budget (a deeper program gets its depth)
    saturation_iterations: int = SATURATION_ITERATIONS
    budgets: Budgets = Budgets()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Options:
        memory = int(environ.get(ENV_VERIFY_MEMORY, 0))
        cache_dir = environ.get(ENV_CACHE_DIR)
        return cls(
            verify_timeout_seconds=float(environ.get(ENV_VERIFY_TIMEOUT, 900)),
            verify_memory_bytes=memory or _three_quarters_of_memory(),
            cache_dir=Path(cache_dir).resolve() if cache_dir else None,
            saturation_iterations=int(environ.get(ENV_SATURATION_ITERATIONS, SATURATION_ITERATIONS)),
            budgets=Budgets(saturation_nodes=int(nodes) if (nodes := environ.get(ENV_SATURATION_NODES)) else None),
        )
