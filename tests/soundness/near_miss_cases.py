"""The verdict each near-miss model of tests/soundness/near_miss.yaml must get.

VERIFIED: correct variants (a guard made too strict would lose them). MISMATCH: buggy variants the
numeric oracle tells apart (a counterexample). NOT_VERIFIED: buggy variants the oracle does not see
on its random inputs (the reason is given; most need an id >= 4, and the oracle draws integers in
[0, the smallest float dim) = [0, 4) here); they must be `unproven` or `mismatch`, never `verified`.
"""

from __future__ import annotations

from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "near_miss.yaml"

VERIFIED = {
    "embed-ge-lt", "embed-gt-le", "guard-always", "abs-of-positive", "guards-kept", "concat-straddle",
    "pmax-of-max", "moe-ep", "rope-table-rows", "interleaved-heads", "topk-tokens", "embed-clipped", "head-max",
    "argsort-tokens", "sorted-moe", "ragged-moe", "sorted-top2", "sorted-ids", "sorted-ids-ends",
    "sorted-ids-starts", "topk-set-experts", "topk-add-into-ones",
    "topk-set-vmapped", "finite-guard",
    "embed-outside", "embed-outside-not", "slots-a2a", "pick-one-hot", "accum-dp", "slots-to-experts",
    "embed-take-clip", "pick-where-ids", "pick-local-one-hot", "router-logits",
    "linear-tail", "experts-tp-combined", "gelu-dp-grad",
    "linear-tail", "experts-tp-combined", "ce-signed-sum", "ce-signed-sum-negated",
    "embed-one-hot", "ce-smoothed", "pick-one-hot-first", "pick-one-hot-2d",
    "positions-sp", "positions-sp-offset-first", "positions-sp-2d",
    "gqa-grad", "gqa-grad-broadcast", "mlp-step",
    "window-distance", "window-distance-negated", "weighted-pick", "weighted-pick-one-hot",
    "queue-positions", "grouped-sorted",
    "attention-scaled", "attention-scaled-positions", "tanh-scaled", "falcon-grouped",
    "flat-fsdp-grads", "flat-fsdp-scattered",
    "neg-loss-dp", "neg-loss-dp-summed-shares", "fsdp-scan", "fsdp-scan-scaled-inside",
    "argsort-combine", "sort-pairs-combine",
    "gathered-moe-ep", "gathered-moe-take-ep", "gathered-moe-dp",
}
MISMATCH = {
    "embed-gt-drops-first", "embed-lt-short", "embed-first-shard-short", "embed-ge-late", "embed-shift-off", "embed-lookup-narrower",
    "guard-ge", "guard-gt", "guard-ne", "guard-eq", "abs-of-sum", "abs-of-negated", "abs-of-difference", "abs-of-minimum",
    "max-with-inf", "min-with-neg-inf", "select-by-iota", "reduce-from-one", "twice-one", "halved", "nudged",
    "slice-of-slice", "rows-then-reshape", "flat-window", "concat-straddle-wrong", "concat-left-only", "concat-other-tail",
    "ppermute-self-only", "pmax-of-min", "pmax-drops-last-column", "pmax-first-shard-short", "moe-ep-shared-slot",
    "moe-ep-rotated-expert", "moe-ep-expert-zero-everywhere", "moe-ep-no-return",
    "rope-table-rows-shifted", "interleaved-heads-odd-first", "topk-local-experts", "embed-clipped-short",
    "head-max-first-bias", "sorted-moe-inclusive-end", "sorted-moe-unsort-by-order", "sorted-moe-gate-in-sorted-order",
    "ragged-moe-add-into-ones", "ragged-moe-added-at-inverse", "sorted-top2-tiled-token-ids",
    "sorted-ids-ends-minus-one", "sorted-ids-from-one", "sorted-ids-starts-minus-two",
    "topk-set-repeated-slot", "topk-set-into-ones", "topk-set-experts-rotated", "select-by-not",
    "embed-outside-drops-first", "embed-outside-and", "embed-outside-ones", "slots-a2a-swapped", "slots-to-experts-reshaped",
    "pick-one-hot-next", "pick-one-hot-past-end", "accum-dp-first-micro", "embed-take-clip-next",
    "embed-take-clip-uneven", "pick-where-next-shard", "pick-where-ge", "pick-local-one-hot-plus-one",
    "pick-where-ones", "router-argmin", "router-negated",
    "linear-tail-bias", "linear-tail-device-gate", "gelu-dp-grad-summed", "gelu-dp-grad-halved",
    "linear-tail-bias", "linear-tail-device-gate", "ce-signed-sum-minus-max", "ce-signed-sum-target-twice",
    "embed-one-hot-next", "ce-smoothed-lse-once", "pick-one-hot-2d-batch-offset",
    "positions-sp-one-late", "positions-sp-2d-batch-index",
    "gqa-grad-half", "mlp-step-layer-cut",
    "window-distance-wide", "window-distance-no-start", "window-distance-inclusive-start",
    "weighted-pick-next-shard", "weighted-pick-ge", "weighted-pick-first-only",
    "queue-positions-inclusive", "queue-positions-across-groups", "grouped-sorted-starts-at-ends",
    "attention-scaled-twice", "attention-masked-diagonal", "attention-masked-kept-below", "falcon-grouped-slot-major",
    "flat-fsdp-grads-off-by-one",
    "neg-loss-dp-psum", "neg-loss-dp-sign",
    "fsdp-scan-count-missing", "fsdp-scan-count-twice", "fsdp-scan-first-scaled",
        "argsort-combine-bottom-k", "argsort-combine-k-off",
    "gathered-moe-ep-next-shard", "gathered-moe-dp-next-expert", "gathered-moe-dp-other-choice",
    "table-rounded-bf16", "iota-table-rounded-bf16", "iota-sum-rounded-bf16",
}
# buggy model -> why the oracle's random inputs do not show the difference
NOT_VERIFIED = {
    "embed-le-claims-next": "only ids equal to a shard's upper end differ; the draws rarely hit them",
    "embed-last-shard-short": "only the largest id differs",
    "embed-mask-transposed": "only rows whose transposed id lies in another shard differ",
    "embed-overlapping-windows": "only id 4 (counted twice) differs",
    "guard-lt": "only the largest id differs",
    "guard-ne-top": "only the largest id differs",
    "guard-eq-top": "only the largest id differs",
    "guard-le": "only the largest id differs",
    "finite-of-other": "only a non-finite y differs; random inputs are finite",
    "narrowed-id-mask": "only ids past the int8 range differ",
    # The routing lemma enumerates index vectors up to Budgets.routing_cases: 16 tokens per device is
    # past it, so a correct layer is `unproven` (see test_routing_limit).
    "moe-ep-past-enumeration": "correct, but past the routing lemma's enumeration limit",
    "embed-one-hot-past-end": "only the largest id differs (its clipped index V reads row V - 1)",
    "tanh-scaled-nudged": "a scale one ulp off: rounding explains the difference",
}
# sorted: test ids in the same order in every process (pytest-xdist's workers must collect alike)
EXPECTED = {**{n: "verified" for n in sorted(VERIFIED)}, **{n: "mismatch" for n in sorted(MISMATCH)},
            **{n: "not verified" for n in sorted(NOT_VERIFIED)}}


def agrees(name: str, status: str) -> bool:
    want = EXPECTED[name]
    return status in ("unproven", "mismatch") if want == "not verified" else status == want

# The default suite's share (`pytest -m slow` runs the rest; docs/soundness.md): for each family of
# side conditions, a correct variant (a guard made too strict loses it) and a buggy one (a guard
# made too loose verifies it), and one buggy model the oracle cannot tell apart.
DEFAULT = {
    "embed-ge-lt", "embed-gt-drops-first",  # range masks of vocabulary-parallel lookups
    "guard-always", "guard-ge",  # comparisons decided by the ids' bounds
    "abs-of-positive", "abs-of-sum", "max-with-inf",  # elementwise side conditions
    "concat-straddle", "rows-then-reshape",  # rewrite rules: slices, reshapes, concatenations
    "pmax-of-max", "ppermute-self-only",  # collectives
    "moe-ep", "moe-ep-shared-slot",  # the routing lemma
    "topk-tokens", "topk-local-experts",  # sorts: lanes of other dims, not windows of the sorted dim
    "sorted-moe", "sorted-moe-unsort-by-order",  # sort-based dispatch: un-sorted by the inverse permutation
    "topk-set-experts", "topk-set-repeated-slot",  # a scatter at a row's distinct columns: a one-hot sum
    "slots-a2a", "slots-a2a-swapped",  # all_to_all of every group's slots: one window of the batched slots
    "pick-one-hot", "pick-one-hot-past-end",  # a gather at a column in range: a one-hot sum
    "pick-where-ids", "pick-where-ge",  # the one-hot written on a shard: lo + arange(n) == ids, where(., x, 0)
    "linear-tail", "linear-tail-bias",  # a partial sum through linear maps, then psummed
    "gelu-dp-grad", "gelu-dp-grad-halved",  # a loss scale by powers of two at other places, odd constants
    "ce-signed-sum", "ce-signed-sum-minus-max",  # a sum of signed terms in one order and grouping
    "embed-one-hot", "embed-one-hot-past-end",  # rows looked up by a one-hot product, index in range
    "positions-sp", "positions-sp-one-late",  # a shard's positions (start + d * n) + arange(n): a window
    "gqa-grad", "gqa-grad-half",  # a reduce over a device's one KV head (a size-1 dim) and the group
    "mlp-step", "mlp-step-layer-cut",  # a training step by passes: a wrong gradient in one layer
    "window-distance", "window-distance-wide",  # a distance q - k tested against constants: tests of q
    "weighted-pick", "weighted-pick-next-shard",  # gates times top-k picks: the gates' one-hot, cut by experts
    "queue-positions", "queue-positions-inclusive",  # running sums of a device's token groups: a window
    "attention-scaled", "attention-masked-kept-below",  # scores times fl(1 / sqrt(hd)), masked constant first
    "tanh-scaled-nudged",  # not verified: a scale whose reciprocal rounds to the reference's divisor
    "flat-fsdp-grads", "flat-fsdp-grads-off-by-one",  # a flat gradient's window cut back into rows
    "neg-loss-dp", "neg-loss-dp-sign",  # the shards' negated shares summed: the negated sum
    "fsdp-scan", "fsdp-scan-first-scaled",  # microbatches' all-reduced gradients added: summed by device
    "argsort-combine", "argsort-combine-bottom-k",  # top-k as argsort(-p): the sort by -p descending by p
    "gathered-moe-ep", "gathered-moe-dp-other-choice",  # w[idx] in a dot batched over tokens: the dense dot gathered
    "guard-lt",  # not verified, though the oracle's draws do not show the difference
}
