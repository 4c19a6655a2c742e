"""Curated mutants of the verifier itself: each must be killed by an assertion on a verdict.

A mutant is (a code snippet that occurs exactly once in equivci/, its replacement, why the change
matters, the checks meant to kill it). The snippet is found by searching the package, so mutants
survive files being moved or renamed; a snippet that no longer occurs (or occurs twice) is an
error to fix here, never a silent skip. Each mutant is applied to a temporary COPY of the package,
put first on sys.path of a child process; the working tree is never modified.

Checks:
* `model:NAME`: a near-miss model of tests/soundness/near_miss.yaml (captured once, up front, by
  the unmutated package), verified by the mutated engine without the numeric oracle. Killed when
  a buggy model comes out `verified`, or a correct one does not while the engine ran to a verdict
  (an internal error, a crash of egglog or a timeout is not a kill).
* `pytest:ARGS`: tests run with the mutated package (whatever their mark: a test moved to `slow`
  still runs here); killed when they fail on an AssertionError.
A mutant's checks stop at its first kill (the outcome names that one), inside a pytest check too (the
tests after a failed assertion do not run); the unmutated baseline runs all.

Each worker is one process that imports the heavy dependencies (egglog, jax, numpy, pytest) once and
forks once per mutant; the fork imports equivci from the mutated copy.

    python bench/verifier_mutants.py                 # every mutant, prints killed / survived
    python bench/verifier_mutants.py --only vocab-gt-offset,abs-any
    python bench/verifier_mutants.py --list
    python bench/verifier_mutants.py --sample        # the first mutant of each module (the default suite's share)
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "equivci"
SOUNDNESS = REPO / "tests" / "soundness"
CHILD_TIMEOUT = 300


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    snippet: str
    replacement: str
    reason: str
    kills: tuple[str, ...]
    # (text, replacement) once more in the snippet's file: the import of a name the replacement uses
    imports: tuple[str, str] | None = None


def M(name: str, snippet: str, replacement: str, reason: str, *kills: str,
      imports: tuple[str, str] | None = None) -> Mutant:
    return Mutant(name, snippet, replacement, reason, kills, imports)


def fresh_vars(*names: str) -> tuple[str, str]:
    """The import edit for rule variables a replacement uses that its rules file does not import."""
    line = "from equivci.terms.language import "
    return line, f"{line}{', '.join(names)}\n{line}"


def near_miss(*names: str) -> str:
    """Term-level near misses of tests/terms/test_rules_numeric.py (must not be proved)."""
    return "pytest:" + " ".join(f"tests/terms/test_rules_numeric.py::test_near_miss_is_not_proved[{n}]" for n in names)


def rule_instance(name: str) -> str:
    """A rule's instances of tests/terms/test_rules_numeric.py (must be proved, and be identities)."""
    return "pytest:" + " ".join(f"tests/terms/test_rules_numeric.py::test_rule_fires_and_is_an_identity[{name}-{s}]"
                                for s in range(4))


# The fingerprint's unit tests (the end-to-end cache test, slower, is in the default suite anyway).
CACHE = "pytest:tests/soundness/test_cache_key.py::"

MUTANTS: tuple[Mutant, ...] = (
    # -- range masks (vocabulary parallelism) ------------------------------------------------------
    M("vocab-gt-offset", '"GT": ("lo", 1)', '"GT": ("lo", 0)', "x > k starts the window at k + 1",
      "model:embed-gt-drops-first", "model:embed-gt-le"),
    M("vocab-ge-offset", '"GE": ("lo", 0)', '"GE": ("lo", -1)', "x >= k starts the window at k",
      "model:embed-ge-late", "model:embed-ge-lt"),
    M("vocab-le-offset", '"LE": ("hi", 1)', '"LE": ("hi", 0)', "x <= k ends the window after k",
      "model:embed-le-claims-next", "model:embed-gt-le"),
    M("vocab-lt-offset", '"LT": ("hi", 0)', '"LT": ("hi", 1)', "x < k ends the window before k",
      "model:embed-lt-short", "model:embed-ge-lt"),
    M("tiles-gap", "if start > covered or (start < covered and not overlap):",
      "if start > covered + 1 or (start < covered and not overlap):", "a gap between windows leaves ids unlooked-up",
      "model:embed-first-shard-short", "model:pmax-first-shard-short"),
    M("tiles-overlap", "if start > covered or (start < covered and not overlap):", "if start > covered:",
      "overlapping windows count an id twice", "model:embed-overlapping-windows"),
    M("tiles-end", "return covered >= hi", "return covered >= hi - 1", "the windows must reach the top id",
      "model:embed-last-shard-short"),
    M("lookup-shift", "if shift != s or w.lo < s or w.hi > e:", "if w.lo < s or w.hi > e:",
      "the local index must be id - (window start)", "model:embed-shift-off",
      "pytest:tests/translate/test_scaled_picks.py::test_a_lookup_at_another_offset_than_its_windows_start_is_no_lookup"),
    M("member-labels", "labels.shape == known.labels.shape and np.array_equal(labels, known.labels)",
      "labels.shape == known.labels.shape", "the mask must test the ids at the positions the rows used",
      "model:embed-mask-transposed"),
    M("member-inside", "(w.hi <= w.lo or known.window.lo <= w.lo and w.hi <= known.window.hi)", "True",
      "the output mask may keep only ids the lookup window holds", "model:embed-lookup-narrower"),
    M("clamp-window", "return Window(ids, lo + shift, hi + shift + 1)", "return Window(ids, lo + shift, hi + shift + 2)",
      "a clip to [lo, hi] leaves ids - c as it is only for ids in [lo + c, hi + c]", "model:embed-clipped-short"),
    M("outside-le-negation", '"LE": "GT"}', '"LE": "GE"}', "not (x <= k) is x > k: the complement of a window "
      "test keeps its end", "model:embed-outside-drops-first", "model:embed-outside"),
    M("outside-or", 'return _operands(ev, p, "or")', 'return _operands(ev, p, "and")',
      "only (x < lo) | (x >= hi) is the complement of [lo, hi) (De Morgan); the & of the two never holds",
      "model:embed-outside-and", "pytest:tests/translate/test_outside_masks.py::"
      "test_a_test_that_is_no_complement_of_a_window_is_refused"),
    M("outside-zero-fill", 'm.attrs == ("select",) and _is_zero(ev, m.args[1]):', 'm.attrs == ("select",):',
      "where(outside, c, rows) masks the rows only for c = 0", "model:embed-outside-ones"),
    M("outside-index-branch", "for kept, outside in ((a, False), (b, True)):", "for kept, outside in ((a, False),):",
      "where(outside, 0, ids - lo) is ids - lo inside the window", "model:embed-outside", "model:embed-outside-not"),
    M("outside-select-bounds", "masks.bounds_under_mask(ev, p, b, outside=True)", "masks.bounds_under_mask(ev, p, b)",
      "select(p, a, b) takes b where p fails: b's bounds there come from the complement of p",
      "pytest:tests/translate/test_outside_masks.py::test_the_branch_chosen_outside_a_window_is_bounded_by_the_complement",
      "model:embed-outside"),
    M("masked-member-factor", "found = _masked(ev, base, lambda rows: ev.scaled(rows, factor))",
      "found = _masked(ev, base, lambda rows: ev.scaled(rows, 2 * factor))",
      "c * where(mask, rows, 0) is a masked lookup only of c * rows, the factor the member carries",
      "pytest:tests/translate/test_scaled_picks.py::"
      "test_a_pick_of_the_unowned_shard_or_of_another_factor_is_a_mismatch[capped-halved] "
      "tests/translate/test_scaled_picks.py::test_a_member_scaled_otherwise_than_its_lookup_is_no_lookup"),
    M("index-select-clamped", "read = Window(w.x, max(w.lo, shift), min(w.hi, shift + size))",
      "read = Window(w.x, max(w.lo, shift), min(w.hi, shift + size + 1))",
      "a gather clamps its index into [0, size): ids - c is read as it is only for ids in [c, c + size)",
      "pytest:tests/translate/test_scaled_picks.py::"
      "test_a_wrapped_negative_index_reads_its_offset_where_the_ids_are_the_shards"),
    M("bounds-through-reshape-only", 'if found is None and term.op == "reshape":',
      "if found is None and term.args and term.args[0].dtype == term.dtype:",
      "a reshape's elements are its operand's, an offset's are not",
      "pytest:tests/translate/test_scaled_picks.py::"
      "test_a_reshape_has_the_bounds_of_its_operand_and_an_offset_none_unstated"),
    M("taken-runs-consecutive", "if rows[j] != rows[j - 1] + 1]]", "if rows[j] < rows[j - 1]]]",
      "a window reads consecutive rows: indices that only increase are several windows",
      "pytest:tests/translate/test_constant_takes.py::"
      "test_a_take_at_constant_indices_is_windows_concatenated_as_xla_computes"),
    M("gather-bcast-collapsed", "out_of = dict(aligned.lhs)", "out_of = dict(aligned.lhs) | dict.fromkeys(dims.collapsed, 0)",
      "a broadcast that varies along an indexed dim is picked at the index: it stays under the gather",
      "pytest:tests/translate/test_gather_through_broadcast.py::"
      "test_a_broadcast_that_varies_along_the_indexed_dim_stays_under_the_gather"),
    # -- a gather at a reshaped index as the reshaped gather (translate/gathers.py, stated in shapes.py) ---
    M("gather-reshaped-index-any-layout", 'if idx.op != "reshape" or dims.operand_batch',
      'if idx.op not in ("reshape", "transpose") or dims.operand_batch',
      "only a reshape keeps the index's elements in order: a transposed index reads its rows in another order",
      "pytest:tests/translate/test_paged_reads.py::test_a_gather_at_a_reshaped_index_is_the_reshaped_gather"),
    M("gather-reshaped-index-unstated", "ev.equal_terms.append([term, unreshaped])", "pass",
      "a device's page column, `pages[table[:, d:d + 1][:, 0]]`, meets the reference's `pages[table]` only "
      "through the gather at the unreshaped index",
      "pytest:tests/translate/test_paged_reads.py::"
      "test_a_page_column_read_on_its_device_is_the_window_of_the_reference_read"),
    M("negate-subtract-order", 'eq(w).to(T.binary("subtract", y, x)),', 'eq(w).to(T.binary("subtract", x, y)),',
      "-(x - y) is y - x, not x - y", near_miss("negate_subtract_same_order")),
    M("subtract-sum-adds-back", ").then(union(e).with_(T.binary(\"subtract\", w, other_term)))",
      ").then(union(e).with_(T.binary(\"add\", w, other_term)))",
      "x - (y + z) is (x - z) - y: the other addend is subtracted, not added back",
      near_miss("subtract_sum_added"),
      "pytest:tests/terms/test_rules_numeric.py -k subtract_sum"),
    M("subtract-bcast-sum-adds-back", ").then(union(e).with_(T.binary(\"subtract\", w, T.bcast(spec, other_term))))",
      ").then(union(e).with_(T.binary(\"add\", w, T.bcast(spec, other_term))))",
      "x - bcast(y + z) is (x - bcast(z)) - bcast(y): the other addend is subtracted, not added back",
      near_miss("subtract_bcast_sum_added"),
      "pytest:tests/translate/test_log_softmax_shards.py"),
    M("one-wide-written-swapped", "ev.one_wide[outside] = ev.mk(kind, (op,), written, shape)",
      "ev.one_wide[outside] = ev.mk(kind, (op,), written[::-1], shape)",
      "the op as written keeps its operands' order: a difference of one-wide heads is not its negation",
      "pytest:tests/translate/test_one_wide_heads.py::test_the_written_form_is_stated_beside_the_squeezed_one_and_agrees"),
    M("small-map-negation-dropped", "ev.const(np.array(-t if negated else t), x.dtype)", "ev.const(np.array(t), x.dtype)",
      "a term subtracted is the product with the negated constant: subtracting x * k adds x * (-k) twice over",
      "pytest:tests/translate/test_small_maps.py::test_a_small_constant_map_is_built_as_its_sums_of_products"),
    M("negate-add-difference", 'with_(T.unary(f"negate:{t}", T.binary("add", x, y)))',
      'with_(T.unary(f"negate:{t}", T.binary("subtract", x, y)))',
      "(-x) + (-y) is -(x + y), not -(x - y)",
      "pytest:tests/terms/test_rules_numeric.py -k negate_add",
      "pytest:tests/translate/test_training_losses.py::"
      "test_training_losses_over_devices_and_microbatches[xent-unrolled-subtracted]"),
    M("window-same-range", "if own is not None and (own.dim, own.start, own.stop) == (w.dim, w.start, w.stop):",
      "if own is not None and own.dim == w.dim:", "both operands of an elementwise op must be the same window",
      "model:head-max-first-bias"),
    M("select-runs-branch", "parts = [ev.slice_term(a if line[lo] else b, dim, lo, hi)",
      "parts = [ev.slice_term(b if line[lo] else a, dim, lo, hi)",
      "a run where the constant mask holds is the first branch's window",
      "pytest:tests/translate/test_general_facts.py::test_equivalent_pairs_verify[rows-masked] "
      "tests/translate/test_general_facts.py::test_near_misses_are_mismatches[rows-masked-reversed]"),
    M("pad-low-high", "for size in (low, high):", "for size in (high, low):",
      "low padding goes before the operand, high padding after it",
      "pytest:tests/translate/test_general_facts.py::test_near_misses_are_mismatches[rows-padded-in-front]"),
    M("reduce-same-reducer", "if members[0].attrs[0] != reducer or dim not in reduced:",
      "if dim not in reduced:", "a max of window minima is not the minimum", "model:pmax-of-min"),
    M("narrowing-convert", "if info.min <= lo and hi <= info.max:", "if True:",
      "a narrowing convert wraps ids past its range", "model:narrowed-id-mask"),
    # -- comparisons decided by bounds -------------------------------------------------------------
    M("decide-lt", '"LT": ra[1] < rb[0],', '"LT": ra[1] <= rb[0],', "x < k holds for all x only below k",
      "model:guard-lt", "model:guard-always"),
    M("decide-le", '"LE": ra[1] <= rb[0],', '"LE": ra[1] <= rb[0] + 1,', "x <= k needs every x <= k",
      "model:guard-le", "model:guard-always"),
    M("decide-ge", '"GE": ra[0] >= rb[1],', '"GE": ra[1] >= rb[1],', "x >= k needs the smallest x >= k",
      "model:guard-ge", "model:guard-always"),
    M("decide-gt", '"GT": ra[0] > rb[1],', '"GT": ra[0] >= rb[1],', "x > k needs the smallest x > k",
      "model:guard-gt", "model:guard-always"),
    M("decide-ne", '"NE": ra[1] < rb[0] or ra[0] > rb[1],', '"NE": ra[1] <= rb[0] or ra[0] > rb[1],',
      "x != k is decided only when k lies outside x's range", "model:guard-ne-top", "model:guard-always"),
    M("decide-eq-never", '"EQ": ra[1] < rb[0] or ra[0] > rb[1],', '"EQ": ra[1] <= rb[0] or ra[0] > rb[1],',
      "x == k is never true only when k lies outside x's range", "model:guard-eq-top", "model:guard-always"),
    M("index-domain", "float(size - 1 - offsets.max())", "float(size - 2 - offsets.max())",
      "valid indices are [0, size - 1]", "model:guard-lt", "model:guard-always"),
    M("offset-input-sign", 'sign = 1 if idx.attrs == ("add",) else -1', "sign = 1",
      "p - c is p offset by -c",
      "pytest:tests/translate/test_offset_windows.py::test_offset_input_sums_the_constants_at_every_level_and_not_a_negated_input"
      " tests/verify/test_index_assumptions.py::test_the_oracle_draws_positions_where_the_proof_assumed_them_valid"),
    M("offset-input-negated", "sides = (0, 1) if sign == 1 else (0,)", "sides = (0, 1)",
      "c - p is no constant offset of p",
      "pytest:tests/translate/test_offset_windows.py::test_offset_input_sums_the_constants_at_every_level_and_not_a_negated_input"),
    # -- elementwise side conditions --------------------------------------------------------------
    M("abs-any", "return all(_nonnegative(a) for a in t.args)  # (an empty",
      "return any(_nonnegative(a) for a in t.args)  # (an empty",
      "a sum is non-negative only when every term is", "model:abs-of-sum", "model:abs-of-positive"),
    M("abs-subtract", 't.attrs[0] in ("add", "multiply", "maximum")', 't.attrs[0] in ("add", "multiply", "maximum", "subtract")',
      "a difference of non-negative values can be negative", "model:abs-of-difference"),
    M("abs-negate", 'if t.op == "unary" and t.attrs[0] in ("exponential", "abs"):',
      'if t.op == "unary" and t.attrs[0] in ("exponential", "abs", "negate"):', "-exp(x) is negative",
      "model:abs-of-negated"),
    M("neutral-max", "neutral = -np.inf if op == \"maximum\" else np.inf", "neutral = np.inf if op == \"maximum\" else -np.inf",
      "only max(x, -inf) and min(x, inf) are x", "model:max-with-inf", "model:min-with-neg-inf", "model:guards-kept"),
    M("finite-predicate", 'if op == "select" and args[0].op == "unary" and args[0].attrs',
      'if op == "select" and args[0].op == "unary" or args[0].attrs',
      "select(p, x, c) is x only for p = is_finite(x), not for any unary predicate",
      "model:select-by-not", "model:finite-guard"),
    M("finite-same-value", 'args[0].attrs == ("is-finite",) and args[0].args[0] is args[1]',
      'args[0].attrs == ("is-finite",)', "select(is_finite(x), x, c) is x only for the same x",
      "model:finite-of-other"),
    M("select-uniform", "if all_equal(value):\n        return a if bool", "if True:\n        return a if bool",
      "a constant predicate picks one branch only when uniform",
      "model:select-by-iota"),
    M("reduce-init", "if init_value is None or not is_identity(reducer, init_value):", "if init_value is None:",
      "a reduction from a non-neutral start adds the start", "model:reduce-from-one"),
    M("factor-all-equal", "if linear and len(held) == 1 and (factor := held.pop()) != 1:",
      "if linear and held and (factor := max(held)) != 1:",
      "a factor comes out of a sum only when every non-zero term has it", "model:twice-one"),
    M("factor-divide", "return self.rescaled(base, factor / value) or self.rescaled(bases[0], factors[0] / value)",
      "return self.rescaled(base, factor * value) or self.rescaled(bases[0], factors[0] * value)",
      "x / c is x * (1 / c)", "model:halved"),
    M("slice-compose", "return self.slice_term(x.args[0], dim, inner_start + start, inner_start + stop)",
      "return self.slice_term(x.args[0], dim, start, stop)", "a slice of a slice is offset by the outer start",
      "model:slice-of-slice"),
    M("permute-zero-fill", "out.append(ops[0][source[d]])\n            else:\n                out.append(\n                    ev.const(",
      "out.append(ops[0][source[d]])\n            else:\n                out.append(\n                    ops[0][d] if True else ev.const(",
      "a device that no pair targets receives zeros", "model:ppermute-self-only"),
    M("relaid-order", "in_order = np.array_equal(block.ravel(), local)", "in_order = True",
      "a moved value is a window only where its labels read the box in order",
      "pytest:tests/translate/test_relaid_windows.py::test_a_transposed_box_is_no_window "
      "tests/translate/test_relaid_windows.py::test_rows_of_two_sources_read_across_are_no_window"),
    M("uniform-kept-by-term", "        key = id(value)\n", "        key = id(t)\n",
      "uniform()'s answers are kept by the constant array a term holds, not by the term",
      "pytest:tests/translate/test_kept_answers.py::test_uniform_follows_the_constant_a_term_holds_not_the_term"),
    M("relaid-layout-box", 'return ("piece", index[whole], box, piece.shape, perm)',
      'return ("piece", index[whole], piece.shape, perm)',
      "relaid's answers are kept by layout: which box of its whole a piece is belongs to it",
      "pytest:tests/translate/test_relaid_windows.py::test_pieces_of_other_boxes_moved_alike_are_windows_of_their_own_boxes"),
    M("relaid-piece-order", "        if np.array_equal(block.transpose(placed).ravel(), local):\n            return tuple(placed)",
      "        return tuple(placed)", "a group piece's whole is read in another dim order only where its labels say so",
      "pytest:tests/translate/test_relaid_windows.py::test_rows_read_in_an_order_no_transpose_gives_are_no_window"),
    M("relaid-reorderable", "if source in reorderable else None", "",
      "only group pieces' wholes are read in another dim order",
      "pytest:tests/translate/test_relaid_windows.py::test_a_transposed_read_of_a_plain_value_keeps_its_form"),
    M("relaid-run-shape-order", " and np.array_equal(block.transpose(perm).ravel(), local):", ":",
      "a dim order that gives the run's shape must still read the labels in order",
      "pytest:tests/translate/test_relaid_windows.py::test_rows_read_in_an_order_no_transpose_gives_are_no_window"),
    M("relaid-parts-fallback",
      "return found or _windows_at(operand, out_shape, budget, known, memo, True)",
      "return found",
      "without the concatenations' parts as sources, the blocks of a transposed value an all-to-all joins "
      "(Ulysses' heads back to the sequence shards) stay a reshape of a transpose, no window",
      "pytest:tests/translate/test_all_to_all_resharding.py::test_blocks_of_transposed_members_are_joined_along_the_concat_dim"),
    M("concat-transposes-alike", "all(p.op == \"transpose\" and p.attrs == parts[0].attrs for p in parts)",
      "all(p.op == \"transpose\" for p in parts)",
      "blocks transposed by different permutations are no transpose of their join",
      "pytest:tests/translate/test_all_to_all_resharding.py::test_blocks_transposed_differently_are_joined_as_written"),
    M("a2a-tuple-order", "operand(group_of[d].index(d), g) for g in group_of[d]",
      "operand(group_of[d].index(g), d) for g in group_of[d]",
      "the tuple all-to-all sends each member's k-th operand to member k, not a device its own operands",
      "pytest:tests/translate/test_all_to_all_resharding.py::test_the_tuple_all_to_all_sends_operand_k_to_member_k"),
    M("index-write-bounds", "if bounds is None or bounds[0] < 0 or bounds[1] > x.shape[dim] - width:",
      "if bounds is None:",
      "a scatter drops an update whose window leaves x where a dynamic update clamps: they agree only for valid indices",
      "pytest:tests/translate/test_index_writes.py::test_a_scatter_whose_index_may_leave_the_rows_is_not"),
    M("relaid-swapped-dot-perm", "tuple(perm[int(k)] for k in np.argsort(back))", "perm",
      "a dot of a piece's operands swapped holds the piece's elements with the free dims exchanged",
      "pytest:tests/translate/test_relaid_windows.py::test_a_dot_of_a_pieces_operands_swapped_is_the_piece_transposed"),
    M("device-sums-same-factor", "if factor != fb or found_a is None", "if found_a is None",
      "two sums over devices add up by device only when scaled alike (one microbatch's 1/M is not the other's)",
      "model:fsdp-scan-first-scaled", "pytest:tests/translate/test_sums_by_device.py"),
    M("negated-shares-sign", 'return ev.scaled(ev.normal("unary", ("negate",), [total], Shape(total.dtype, total.shape)), factors.pop())',
      "return ev.scaled(total, factors.pop())", "the sum of the devices' negated shares is the negated sum, the sign kept",
      "model:neg-loss-dp-sign", "model:neg-loss-dp"),
    M("negated-signed-sum-sign", 'ev.equal_terms.append([term, ev.normal("unary", ("negate",), [inner], shape)])',
      "ev.equal_terms.append([term, inner])",
      "a sum of a signed sum is the negated sum of its negation, never that sum itself",
      "pytest:tests/translate/test_negated_signed_sums.py::test_each_negated_signed_sum_computes_what_xla_computes",
      "pytest:tests/translate/test_negated_signed_sums.py::test_near_misses_of_the_partition_function_are_mismatches"),
    M("negated-signed-sum-unnegated",
      'form = signed_sums.one_form(ev, ev.mk("unary", ("negate",), [z], Shape(z.dtype, z.shape)))',
      "form = signed_sums.one_form(ev, z)",
      "the sum a signed sum's sum negates is the sum of its negation, not of the signed sum itself",
      "pytest:tests/translate/test_negated_signed_sums.py::test_each_negated_signed_sum_computes_what_xla_computes"),
    M("unit-batch-any-size",
      "if lhs.shape[lb] == 1 and rhs.shape[rb] == 1]",
      "if lhs.shape[lb] == rhs.shape[rb]]",
      "only a size-1 dim moves by a reshape; a batch dim of several elements moved so is another value",
      "pytest:tests/translate/test_unit_head_dots.py::test_a_dot_with_its_unit_batch_dims_moved_computes_what_xla_computes"),
    M("negated-shares-any-factor", "if len(members) < 2 or len(factors) != 1 or any(", "if len(members) < 2 or any(",
      "devices' negated shares add up as the negated sum under their factor only when they share it",
      "pytest:tests/translate/test_negated_shares.py::test_negated_shares_under_different_factors_are_left_as_written"),
    M("relaid-swapped-dot-spec", "key = (spec.text(), term.args[1], term.args[0], term.dtype)",
      "key = (term.attrs[0], term.args[1], term.args[0], term.dtype)",
      "only the swapped spec (contracting the same dims) makes a dot of swapped operands the piece",
      "pytest:tests/translate/test_relaid_windows.py::test_a_dot_of_swapped_operands_contracting_other_dims_is_not_the_piece"),
    M("relaid-transposed-piece-inverse", "np.argsort(parse_transpose(piece.attrs[0]))",
      "parse_transpose(piece.attrs[0])", "the operand of transpose(y, p) is the piece transposed by p's inverse",
      "pytest:tests/translate/test_relaid_windows.py::test_the_operand_of_a_transposed_piece_is_the_piece_transposed_back"),
    # -- rewrite rules -------------------------------------------------------------------------------
    M("reshape-lift-guard", "eq((a * s1) % s2).to(i64(0)),\n        eq((b * s1) % s2).to(i64(0)),\n    ).then(",
      ").then(", "a reshape of a slice is a slice only at group boundaries (either guard alone suffices on\n"
      "well-typed terms: b - a is a multiple of the group's tail, so both are removed)",
      "model:rows-then-reshape"),
    M("reshape-group-head-offset",
      "o, ((a * s1) % s2) / (s2 / n), ((a * s1) % s2) / (s2 / n) + m", "o, 0, m",
      "m heads of a group split as [1, m, hd] start at the head the window starts at, not at the group's first",
      near_miss("reshape_lift_in_group_other_heads"), rule_instance("layouts/reshape_lift_in_group")),
    M("reshape-group-lead-offset",
      "union(e).with_(z.slice(o, (c * n + a) * (s1 / n) / s2, (c * n + b) * (s1 / n) / s2))",
      "union(e).with_(z.slice(o, a * (s1 / n) / s2, b * (s1 / n) / s2))",
      "the merge of group c's heads is a run after the c groups before it",
      near_miss("reshape_merge_in_group_other_group"), rule_instance("layouts/reshape_merge_in_group")),
    M("reshape-push-guard", "eq((a * s2) % s1).to(i64(0)),\n        eq((b * s2) % s1).to(i64(0)),\n    ).then(",
      ").then(", "a slice of a reshape is a reshape only at group boundaries (both guards, as above)",
      "model:flat-window"),
    M("reshape-undone-inverse", "ReshapeGroup(g.n_out, g.out_tail, g.n_in, g.in_tail)",
      "ReshapeGroup(g.n_out, g.in_tail, g.n_in, g.out_tail)",
      "the reshape back swaps each group's sides, tails with them (a flat gradient cut back into rows)",
      "model:flat-fsdp-grads", "model:flat-fsdp-scattered", rule_instance("layouts/reshape_undone")),
    M("gather-vector-kept", "            drop_idx.add(self.vector_dim)\n", "            pass\n",
      "`pages[table]` lowers with an explicit one-coordinate index vector, a page column's index with none "
      "once its size-1 dim is dropped: they meet only in one form",
      "pytest:tests/translate/test_paged_reads.py::test_a_one_coordinate_index_vector_is_made_implicit"),
    M("concat-left-bound", "eq(n).to(dim(x, d)),\n        b <= n,\n    ).then(union(e).with_(x.slice(d, a, b)))",
      "eq(n).to(dim(x, d)),\n    ).then(union(e).with_(x.slice(d, a, b)))",
      "a slice of [x; y] is a slice of x only when it ends inside x", "model:concat-left-only",
      "model:concat-other-tail", near_miss("concat_slice_past_left")),
    M("concat-straddle-offset", "union(e).with_(T.concat(x.slice(d, a, n), y.slice(d, 0, b - n), d))",
      "union(e).with_(T.concat(x.slice(d, a, n), y.slice(d, 1, b - n + 1), d))",
      "the part of a straddling slice from y starts at y's row 0", "model:concat-straddle-wrong",
      "model:concat-straddle", near_miss("concat_straddle_shifted")),
    M("slice-compose-rule", "union(e).with_(x.slice(d, a + c, a + g))",
      "union(e).with_(x.slice(d, c, g))",
      "composed slices add their offsets", rule_instance("slices/compose")),
    M("saturation-budget-unprojected", "if rows * growth >= nodes or not memory.fits(predicted, limit):",
      "if rows >= nodes or not memory.fits(predicted, limit):",
      "a pass that would end past the size budget, growing as the one before it, is not started (one pass "
      "from just under it took an e-graph past 17 GB)",
      "pytest:tests/prove/test_budget.py::test_a_run_stops_at_its_size_budget_and_says_so"),
    M("saturation-outgrown-runs-again", "    if proof.outgrown or proof.runaway:\n        # The budget grows",
      "    if proof.outgrown > proof.node_budget or proof.runaway:\n        # The budget grows",
      "an e-graph that reached its size budget runs no more passes for the terms added to it, though the "
      "derived budget grows with them",
      "pytest:tests/prove/test_budget.py::test_an_outgrown_proof_with_a_derived_budget_runs_no_pass_for_added_terms"),
    M("saturation-memory-unguarded", "return predicted is None or predicted <= SHARE * limit", "return True",
      "a pass predicted past half the memory cap is not started: its matching grows with the square of the "
      "e-graph's growth, which the rows do not bound (split 17's pipeline crashed past 17 GB from 0.9M rows)",
      "pytest:tests/prove/test_budget.py::test_a_run_stops_before_a_pass_predicted_to_take_more_memory_than_its_"
      "share_of_the_cap"),
    M("hypotheses-unbounded", "own = None if growth is None else rows + growth * (rows - before)", "own = None",
      "a localization hypothesis adds at most GROWTH times the rows it loads",
      "pytest:tests/prove/test_budget.py::test_a_hypothesis_adds_at_most_growth_times_the_rows_it_loads"),
    M("layer-memory-stop-stored", 'if stored is None and not result.get("memory"):', "if stored is None:",
      "a layer the memory stopped is not stored: the cap is no part of its key",
      "pytest:tests/prove/test_budget.py::test_a_layer_stopped_by_memory_is_not_stored"),
    M("numeric-check-failure-cached", 'return f"the numeric check could not run: {exc}", True',
      'return f"the numeric check could not run: {exc}", False',
      "a numeric check that was tried and failed is no cached verdict evidence",
      "pytest:tests/verify/test_numeric_check_limits.py::"
      "test_a_numeric_check_past_its_time_limit_is_unproven_and_not_stored"),
    M("constant-relaid-unknown", "return next((known.term for known in self._known if known.content == content), None)",
      "return None",
      "a constant holding a known table's elements with other unit dims is that table reshaped (a "
      "vmapped reference's [1, 1, d] frequencies against a device's [d])",
      "pytest:tests/translate/test_relaid_constants.py::test_frequencies_laid_out_two_ways_verify"),
    M("concat-merge-order", "eq(e).to(T.concat(x.slice(d, a, b), x.slice(d, b, c), d))",
      "eq(e).to(T.concat(x.slice(d, b, c), x.slice(d, a, b), d))",
      "two slices join in order (a gap between them is ill-typed: egglog would crash, no kill)",
      near_miss("concat_out_of_order", "all_gather_out_of_device_order")),
    M("binary-lift-nested-windows", "eq(v).to(y.slice(d, a, b)),", "eq(v).to(y.slice(d, k, j)),",
      "an op lifts out of a two-dim window only when both operands take the same window",
      near_miss("binary_lift_nested_other_rows"), imports=fresh_vars("k", "j")),
    M("contraction-merge-adjacent", "contraction_piece(spec, w, x, y, k, b, c),",
      "contraction_piece(spec, w, x, y, k, g, c),",
      "partial dots join only over adjacent windows", near_miss("contraction_merge_gap", "contraction_merge_overlap"),
      imports=fresh_vars("g")),
    M("contraction-merge-across-adjacent", 'T.binary("add", _piece(b, c), w)', 'T.binary("add", _piece(g, c), w)',
      "partial dots added among other terms join only over adjacent windows", near_miss("contraction_merge_across_gap"),
      imports=fresh_vars("g")),
    M("contraction-merge-across-rest", 'T.binary("add", _piece(a, c), T.binary("add", z, w))',
      'T.binary("add", _piece(a, c), z)', "the other terms of both partial sums stay in the sum",
      near_miss("contraction_merge_across_drops_term")),
    M("reduce-merge-combiner", "eq(e).to(T.binary(r, T.reduce(r, key, x.slice(k, a, b))",
      'eq(e).to(T.binary("add", T.reduce(r, key, x.slice(k, a, b))',
      "partial reductions join with their own reducer (dropping `reduced` is ill-typed: a crash, no kill)",
      near_miss("reduce_merge_wrong_combiner")),
    M("repeat-same-group", "eq(a / n).to((b - 1) / n),", "",
      "a window of a repeat is one element of y only inside one group", near_miss("repeat_window_across_groups")),
    M("transpose-push-perm", "eq(e).to(T.transpose(spec, x).slice(o, a, b)),\n        eq(k).to(perm_in(spec, o)),\n    ).then(",
      "eq(e).to(T.transpose(spec, x).slice(o, a, b)),\n        eq(k).to(perm_in(spec, o)),\n        eq(k).to(o),\n    ).then(",
      "(weaker) a slice of a transpose moves to the permuted dim", rule_instance("layouts/transpose_push")),
    M("dupdate-same-window", "eq(e).to(T.dupdate(d, x.slice(k, a, b), y.slice(k, a, b), z)),",
      "eq(e).to(T.dupdate(d, x.slice(k, a, b), y.slice(k, c, g), z)),",
      "a buffer's window is updated by the same window of the update (the dslice rule's `k != d` guard "
      "is ill-typed without it: a crash, no kill)", near_miss("dupdate_other_window"), imports=fresh_vars("c", "g")),
    M("aligned-same-window", "eq(e).to(T.aligned(key, x.slice(k, a, b), y.slice(j, a, b))),",
      "eq(e).to(T.aligned(key, x.slice(k, a, b), y.slice(j, c, g))),",
      "aligned operands must be sliced at the same window", near_miss("aligned_reduce_misaligned_windows",
                                                                      "aligned_gather_misaligned_rows",
                                                                      "aligned_sort_misaligned_lanes"),
      imports=fresh_vars("c", "g")),
    # -- sorts and top-k -----------------------------------------------------------------------------
    M("sort-dim-aligned",
      "table = tuple((k, k) for k in range(rank) if k != dim)\n    return AlignedMap(table, table, ((dim, size),))",
      "table = tuple((k, k) for k in range(rank))\n    return AlignedMap(table, table, ())",
      "a sort's own dim is not aligned: sorting a window of it is no window of the sort (top-k over a "
      "device's experts)", near_miss("aligned_sort_window_of_sorted_dim"), "model:topk-local-experts"),
    M("sort-unstable", 'if inst.attrs.get("is_stable") != "true" or len(dims) != 1',
      "if len(dims) != 1",
      "an unstable sort may order ties by more than the lane: it stays opaque",
      "pytest:tests/translate/test_sorts.py::test_an_unstable_sort_stays_opaque"),
    M("topk-direction", 'order = "GT" if inst.attrs.get("largest", "true") == "true" else "LT"',
      'order = "LT" if inst.attrs.get("largest", "true") == "true" else "GT"',
      "top-k takes the largest values first",
      "pytest:tests/translate/test_sorts.py::test_top_k_is_the_first_k_of_the_descending_sort_ties_in_index_order"),
    # -- top-k written as a sort (translate/sorts.py, orders.sort_direction, picks.sorted_pick) -------
    M("sort-negation-keeps-order", "flipped = sorted_lanes(ev, x.args[0], y, dim, FLIPPED[order], dtypes)",
      "flipped = sorted_lanes(ev, x.args[0], y, dim, order, dtypes)",
      "a sort by -x ascending is the sort by x descending: the order flips with the negation",
      "model:argsort-combine",
      "pytest:tests/translate/test_top_k_by_sort.py::test_top_k_indices_by_sort_are_one_term"),
    M("sort-direction-signed-zero", "math.inf, math.inf, -0.0]", "math.inf, math.inf]",
      "a total-order `<` ranks -0.0 before 0.0, where the sort's numpy model ties them: -0.0 is drawn",
      "pytest:tests/translate/test_top_k_by_sort.py::test_the_direction_of_hand_written_comparators"),
    M("sort-direction-payload", "for rest in ((0, 1), (1, 0), (0, 0))", "for rest in ((0, 0),)",
      "a comparator that breaks ties by another operand orders by more than the key",
      "pytest:tests/translate/test_top_k_by_sort.py::test_the_direction_of_jax_comparators",
      "pytest:tests/translate/test_top_k_by_sort.py::test_the_direction_of_hand_written_comparators"),
    M("sorted-pick-of-keys-only", "payload, sorted_output = (held, 0) if x is keys else (x, 1)",
      "payload, sorted_output = (held, 0)",
      "a pick of another value at the sort's permutation is that value carried along, not the sorted keys",
      "pytest:tests/translate/test_top_k_by_sort.py::test_a_pick_of_another_value_is_that_value_sorted_along"),
    M("sorted-pick-positions", "    if not literals.holds_positions(ev, held, v):\n        return None\n", "",
      "a sort's second output is the permutation only when it sorted the positions along",
      "pytest:tests/translate/test_top_k_by_sort.py::test_a_pick_at_a_sort_of_other_positions_is_no_sorted_value"),
    # -- a top-k merged from the pieces' top-k (translate/sorts.merged_top) ---------------------------
    M("merged-top-k-within-candidates", "if stop > min(k for _, k in pieces):", "if stop > sum(k for _, k in pieces):",
      "the merge's first k are the whole's only where every piece kept at least k candidates",
      "pytest:tests/translate/test_merged_top_k.py::test_no_merge_where_it_does_not_hold"),
    M("merged-top-k-paired-payload", "any(u is not v for u, v in zip(held[0].args, piece[0].args))",
      "any(u.shape != v.shape for u, v in zip(held[0].args, piece[0].args))",
      "a candidate's payload is carried by its own piece's sort, not by another piece's",
      "pytest:tests/translate/test_merged_top_k.py::test_no_merge_where_it_does_not_hold"),
    M("merged-top-k-first-candidates", "if t.attrs[0] != dim or t.attrs[1] != 0:", "if t.attrs[0] != dim:",
      "the candidates are each piece's first k_i: a window from later on drops some of the whole's top k",
      "pytest:tests/translate/test_merged_top_k.py::test_no_merge_where_it_does_not_hold"),
    # -- an argmax combined from the pieces' max and argmax (translate/argmax_pieces.py) ---------------
    M("combined-argmax-offsets", "or c != c0 + i * n for i, (w, d, _, c) in", "for i, (w, d, _, c) in",
      "a piece's ids are the whole's only when offset by the piece's start",
      "pytest:tests/translate/test_combined_argmax.py::test_no_combined_argmax_where_it_does_not_hold"),
    M("combined-argmax-paired", "if r_max.args[0] is not w or", "if r_max.args[0].shape != w.shape or",
      "the winner's ids are its own piece's argmax, not another piece's",
      "pytest:tests/translate/test_combined_argmax.py::test_no_combined_argmax_where_it_does_not_hold"),
    M("combined-argmax-first-ties", "        if orders.first_on_ties(ev.module, reducer):\n", "        if True:\n",
      "the first piece holding the largest value holds the whole's first largest value only if each piece's "
      "argmax keeps its first",
      "pytest:tests/translate/test_combined_argmax.py::test_no_combined_argmax_where_it_does_not_hold"),
    # -- a transpose of size-1 dims only undone under a reshape (translate/shapes.unit_moves_undone) ------
    M("unit-moves-other-dims", "return y if moves_unit_dims_only(y.shape, parse_transpose(x.attrs[0])) else x",
      "return y",
      "only a transpose that keeps the order of the dims other than size-1 ones moves no element",
      "pytest:tests/translate/test_unit_head_merges.py::test_a_merge_of_a_transpose_of_other_dims_is_no_squeeze"),
    # -- a window through a reshape of size-1 dims only (translate/windows._unit_reshape) -----------------
    M("unit-reshape-window-regroups", "    if [x.shape[d] for d in kept_in] != [t.shape[d] for d in kept_out]:\n        return None\n",
      "    if len(kept_in) < len(kept_out):\n        return None\n",
      "a window passes a reshape along the same dim only where the reshape adds or drops size-1 dims alone",
      "pytest:tests/translate/test_squeezed_windows.py::test_no_window_through_a_reshape_that_regroups_dims"),
    M("owner-min-offsets", "w.shape != w0.shape or d != e or c != c0 + i * n or t is not top",
      "w.shape != w0.shape or d != e or t is not top",
      "the smallest candidate id is the whole's argmax only where each shard's ids are offset by its start",
      "pytest:tests/translate/test_combined_argmax.py::test_shard_local_ids_or_another_maximum_are_mismatches"),
    M("owner-min-largest-max", "and _maxima_of(top) != maxima", "and False",
      "a shard offers its id only where its max is the largest of all: tested against another value, none may",
      "pytest:tests/translate/test_combined_argmax.py::test_shard_local_ids_or_another_maximum_are_mismatches"),
    M("product-sum-layout", "        if kept[: len(m_batch)] != list(m_batch):\n            return None\n", "",
      "the sum over the contracted dims keeps the other operand's dim order: the dot's only when its "
      "batch dims lead",
      "pytest:tests/translate/test_product_sums.py::test_a_sum_laid_out_other_than_the_dot_is_transposed_or_not_stated"),
    M("product-sum-product", "product = ev.binary(\"multiply\", m, spread)", "product = ev.binary(\"add\", m, spread)",
      "a dot sums products",
      "pytest:tests/translate/test_product_sums.py::test_an_einsum_of_one_hots_meets_the_scatter_combine"),
    # -- routing -------------------------------------------------------------------------------------
    M("routing-slot-once", "np.all(in_expert == 1) and np.all(m.sum(axis=0) <= 1))", "np.all(in_expert == 1))",
      "no slot may hold two tokens", "model:moe-ep-shared-slot", "model:moe-ep"),
    M("routing-in-expert", "np.all(per_token == 1) and np.all(in_expert == 1) and", "np.all(per_token == 1) and",
      "a token's slot must be in the expert it chose", "model:moe-ep-rotated-expert"),
    M("routing-expert-weights", "if not np.all(experts == j):\n            return None", "",
      "a device must apply the weights of its slots' expert", "model:moe-ep-expert-zero-everywhere"),
    M("routing-own-slots", "if tuple(r.slots[a, b]) != (dev, pos[e_row], pos[c_row]) or r.ex[a, b] != pos[e_row]:",
      "if False:", "the combine must read this device's own slots, each with its expert's output (either "
      "clause alone stops the near miss)", "model:moe-ep-no-return"),
    M("routing-other-order-free", "if free != sorted(free):", "if False:",
      "a combine read over the expert's dot in the other operand order keeps its output only where the "
      "uncontracted dims keep their order",
      "pytest:tests/translate/test_routing.py::test_a_combine_reads_the_expert_output_in_either_operand_order"),
    # -- sort-based dispatch (translate/permutations.py) -----------------------------------------------
    M("segment-end-strict", 'if (op1, op2) != ("LE", "LT") or b1 is not b2:', 'if op1 != "LE" or b1 is not b2:',
      "a ragged group is [starts, ends): its end is excluded", "model:sorted-moe-inclusive-end", "model:sorted-moe"),
    M("scatter-add-back-same-perm", "            or onehot.args[1] is not found.perm\n", "",
      "rows are added back at the rows of the permutation that sorted them", "model:ragged-moe-added-at-inverse",
      "model:ragged-moe"),
    M("put-back-same-perm", "if found is None or found.perm is not perm or found.row != 0", "if found is None or found.row != 0",
      "only the inverse of the permutation that sorted the rows puts them back", "model:sorted-moe-unsort-by-order"),
    M("pair-token-repeat", "if m * k != len(rows) or not np.array_equal(rows, np.repeat(np.arange(m), k)):",
      "if m * k != len(rows):", "rows at constant indices are whole rows each repeated k times",
      "model:sorted-top2-tiled-token-ids", "model:sorted-top2"),
    M("group-ids-ends-offset", "    if inner is not None:\n        return inner, 0\n",
      "    if inner is not None:\n        return inner, 1\n",
      "marks counted at the groups' ends give the group itself, at the starts the group plus one",
      "model:sorted-ids-ends-minus-one", "model:sorted-ids-ends"),
    M("iota-table", "        or not np.array_equal(table, np.arange(x.shape[0]))\n", "",
      "only an iota table's element i is i", "model:sorted-ids-from-one"),
    M("offset-cancel-sum", " or signs[a.attrs[0]] * c1 + signs[op] * c2 != 0", "",
      "(x + c1) - c2 is x only when the constants cancel", "model:sorted-ids-starts-minus-two", "model:sorted-ids-starts"),
    # -- scatters at each row's columns as one-hot sums (translate/one_hots.py) -----------------------
    M("one-hot-distinct-columns", "not summed or (len(summed) == 1 and _distinct_along(ev, column, summed[0]))", "True",
      "an overwrite is a sum only when no row writes one column twice",
      "model:topk-set-repeated-slot", "model:topk-set-experts"),
    M("one-hot-set-into-zeros", "if not adds and not (zero and (", "if not adds and not ((",
      "an overwrite keeps nothing of the operand where it writes: a sum on top only over zeros",
      "model:topk-set-into-ones", "model:topk-add-into-ones"),
    M("one-hot-sort-output", 'order_dim_output[-2:] != [str(dim), "1"]', "False",
      "only a sort's index output along the summed dim is a permutation of distinct lanes",
      "pytest:tests/translate/test_translation_against_xla.py::test_overwrites_that_could_lose_a_write_stay_opaque"),
    # -- an overwrite of one window per row at a data position as a select (translate/row_writes.py) ----
    M("row-write-column-eq", '(compare_text("EQ", c.dtype),)', '(compare_text("GE", c.dtype),)',
      "the row's window is written at the one position equal to its column, not at every position past it",
      "pytest:tests/translate/test_row_writes.py::test_a_row_write_is_a_select_and_computes_what_xla_computes"),
    M("row-write-overwrite-only", 'scatter_combiner(ev.module, inst) != "set"', "scatter_combiner(ev.module, inst) is None",
      "a scatter that adds its updates keeps what the operand holds: no select",
      "pytest:tests/translate/test_row_writes.py::test_a_row_add_is_no_select"),
    M("unclamped-inside", "float(lo.max()) <= found[0] and found[1] <= float(hi.min())", "float(lo.max()) <= found[0]",
      "a clamp leaves its operand only where the operand's bounds lie under its upper end too",
      "pytest:tests/translate/test_row_writes.py::test_a_row_write_is_a_select_and_computes_what_xla_computes"),
    # -- bounds of a remainder, of x & c, and of a function of one bounded value (translate/bounds.py) --
    M("remainder-bound-width", "top = abs(k) - 1", "top = abs(k) - 2",
      "x rem c reaches |c| - 1",
      "pytest:tests/translate/test_modulus_bounds.py::test_bounds_of_a_modulus_are_exact_and_hold_what_xla_computes"),
    M("remainder-bound-sign", "lo = 0 if found is not None and found[0] >= 0 else -top", "lo = 0",
      "HLO's remainder takes the sign of x: negative for a negative x",
      "pytest:tests/translate/test_modulus_bounds.py::test_bounds_of_a_modulus_are_exact_and_hold_what_xla_computes"),
    M("and-bound", "ev._set_bounds(term, 0, k)", "ev._set_bounds(term, 0, k - 1)",
      "x & c reaches c (every bit of c set in x)",
      "pytest:tests/translate/test_modulus_bounds.py::test_bounds_of_a_modulus_are_exact_and_hold_what_xla_computes"),
    M("enumerated-every-value", "np.arange(int(lo), int(hi) + 1, dtype=np_dtype)", "np.arange(int(lo), int(hi), dtype=np_dtype)",
      "a function of a bounded value is bounded by its values at every value of the bounds, the top one included",
      "pytest:tests/translate/test_modulus_bounds.py::test_bounds_of_a_modulus_are_exact_and_hold_what_xla_computes"),
    # -- an order test of two integers in one form (translate/elementwise.py, ordered_difference) -------
    M("ordered-difference-fits", "return info.min <= lx - hy and hx - ly <= info.max", "return True",
      "x - y >= 0 is x >= y only where x - y does not wrap",
      "pytest:tests/translate/test_ordered_differences.py::test_a_difference_that_may_wrap_is_not_ordered"),
    M("ordered-difference-mirror", "return _compare(ev, MIRRORED[direction], y, x, shape)", "return _compare(ev, direction, y, x, shape)",
      "x >= y is y <= x, not y >= x",
      "pytest:tests/translate/test_ordered_differences.py::test_the_ordered_form_computes_what_xla_computes"),
    M("ordered-difference-stated", "(ordered := ordered_difference(ev, direction, a, b, shape)) is not None", "False",
      "a rolling cache's absolute-position validity meets the slot age's only through the ordered form",
      "pytest:tests/translate/test_ordered_differences.py::test_a_rolling_cache_validity_by_slot_age"),
    M("int-range-top-excluded", "{p: (float(int_range[0]), float(int_range[1] - 1))", "{p: (float(int_range[0]), float(int_range[1]))",
      "the manifest's int_range excludes its upper end: [0, 24) holds no 24",
      "pytest:tests/verify/test_index_assumptions.py::test_a_stated_range_bounds_every_integer_input"),
    # -- a gather of one element per row as a one-hot sum (translate/picks.py) -------------------------
    M("pick-index-bounds", "found is None or found[0] < 0 or found[1] >= x.shape[v]", "found is None",
      "a gather clamps an index outside [0, V) where a one-hot of it is all zeros",
      "model:pick-one-hot-past-end", "model:pick-one-hot"),
    M("pick-lane-order", "or [dims.indices_batch[dims.operand_batch.index(k)] for k in others] != lanes\n", "",
      "the sum keeps the operand's lanes in order: the gather's must be the same lanes",
      "pytest:tests/translate/test_picks.py::test_lanes_gathered_across_stay_a_gather"),
    M("pick-inner-one-hot", "facts.append([inner, *sums])", "pass",
      "the pick of x under log-softmax's x - lse is a one-hot sum too (the logits a device sums)",
      "pytest:tests/translate/test_index_compares.py::test_a_pick_through_a_broadcast_operand_states_the_inner_pick"),
    # -- index compares in one form: constants right, offsets moved, selects as products (translate/elementwise.py)
    M("compare-mirror", '"LT": "GT", "LE": "GE"', '"LT": "LT", "LE": "LE"',
      "c < x is x > c: a compare turned round turns its direction too",
      "pytest:tests/translate/test_index_compares.py::test_a_constant_on_the_left_is_mirrored_to_the_right"),
    M("offset-order-compare", 'if direction not in ("EQ", "NE") and not _exact_order(', "if False and not _exact_order(",
      "x - c < k is not x < k + c where x - c wraps: an order test moves an offset only inside the bounds",
      "pytest:tests/translate/test_index_compares.py::test_an_offset_of_an_order_stays",
      "pytest:tests/translate/test_index_compares.py::test_a_distance_that_can_wrap_stays"),
    M("offset-sign", "scalar if j == 0 else -scalar if negated else scalar", "scalar if j == 0 else scalar if negated else -scalar",
      "x - c == k is x == k + c, not k - c", "model:pick-local-one-hot", "model:pick-local-one-hot-plus-one",
      "pytest:tests/translate/test_index_compares.py::test_an_offset_of_an_equality_moves_to_the_constant"),
    M("order-wrap-operand", "ends = (lo - cmax, hi - cmin, kmin + cmin, kmax + cmax)", "ends = (kmin + cmin, kmax + cmax)",
      "q - k < w is q < k + w only where q - k does not wrap (x's bounds against c's ends)",
      "pytest:tests/translate/test_index_compares.py::test_a_distance_that_can_wrap_stays"),
    M("order-wrap-constant", "ends = (lo - cmax, hi - cmin, kmin + cmin, kmax + cmax)", "ends = (lo - cmax, hi - cmin)",
      "q - c < k is q < k + c only where k + c does not wrap",
      "pytest:tests/translate/test_index_compares.py::test_an_order_test_whose_moved_constant_wraps_stays"),
    M("distance-mirror", "return direction if j == 1 else MIRRORED[direction], _relaid(ev, layout, x), moved",
      "return direction, _relaid(ev, layout, x), moved",
      "c - x <= k is x >= c - k: a subtracted operand turns the test round", "model:window-distance-negated",
      "pytest:tests/translate/test_index_compares.py -k distance_of_positions"),
    M("half-open-step", "_relaid(ev, *_offset_const(ev, b, 1))", "_relaid(ev, *_offset_const(ev, b, 0))",
      "x <= k is x < k + 1, not x < k", "model:window-distance-wide",
      "pytest:tests/translate/test_index_compares.py::test_an_integer_order_test_is_half_open"),
    M("half-open-top", "int(k.max()) >= np.iinfo(np_dtype).max", "int(k.max()) > np.iinfo(np_dtype).max",
      "x <= k is x < k + 1 only below the dtype's largest value (k + 1 wraps there)",
      "pytest:tests/translate/test_index_compares.py::test_an_integer_order_test_is_half_open"),
    M("weighted-pick-one-hot", "product = ev.binary(\"multiply\", weights, one_hot)",
      "product = ev.binary(\"multiply\", weights, weights)",
      "sum_k g_k x[idx_k] weighs row v by the gates of the picks at v: the one-hot, not the gates again",
      "model:weighted-pick", "pytest:tests/translate/test_picks.py -k weighted_one_hot_against"),
    M("weighted-pick-bounds", "if found is None or not (0 <= found[0] and found[1] < x.shape[v]):",
      "if found is None or not (0 <= found[0] and found[1] <= x.shape[v]):",
      "an index that may be V reads row V - 1 (the gather clamps) where its one-hot is all zeros",
      "pytest:tests/translate/test_picks.py::test_no_weighted_one_hot_for_an_index_past_the_rows"),
    M("window-aligned-range", "elif own is not None and (own.dim, own.start, own.stop) == (k, w.start, w.stop):",
      "elif own is not None and own.dim == k:",
      "an aligned map lifts a window only where its operands are windowed alike",
      "pytest:tests/translate/test_window_forms.py::test_near_miss_an_aligned_map_of_windows_of_different_ranges_is_no_window"),
    M("cumsum-other-dim-window",
      "ev.equal_terms.append([ev.slice_term(whole_sum, lifted.dim, lifted.start, lifted.stop), term])",
      "ev.equal_terms.append([ev.slice_term(whole_sum, lifted.dim, 0, lifted.stop - lifted.start), term])",
      "a device's groups' running sums are the window of its groups, not the first groups'",
      "model:queue-positions", "pytest:tests/translate/test_running_sums.py -k another_dim"),
    M("select-zero-product", "p.shape == a.shape and ev.uniform(b) == 0", "p.shape == a.shape",
      "select(p, x, c) is x * p only for c = 0", "model:pick-where-ones",
      "pytest:tests/translate/test_index_compares.py::test_a_select_against_other_values_is_no_product"),
    # -- a scale as the quotient by its rounded reciprocal, masks with the constant branch first
    # (translate/reciprocals.py, elementwise.py; the squeeze out of the swapped dot's order: swapped-squeeze-order)
    M("reciprocal-one-way", "if Fraction(float(c)) != factor or not np.isfinite(q) or one / q != c:",
      "if Fraction(float(c)) != factor or not np.isfinite(q):",
      "x * c is x / q only where c rounds back from q: two scales one ulp apart share their divisor",
      "model:tanh-scaled-nudged", "pytest:tests/translate/test_reciprocal_scales.py -k both_ways"),
    M("reciprocal-unstated", "reciprocals.note(self, result)", "pass",
      "scores times fl(1 / sqrt(hd)) are the reference's scores divided by sqrt(hd)", "model:attention-scaled",
      "pytest:tests/translate/test_reciprocal_scales.py -k xla_computes"),
    M("constant-branch-unnegated", "return [_negated(ev, p, value), b, a]", "return [p, b, a]",
      "select(p, c, x) swaps its branches only with the predicate negated", "model:attention-masked-kept-below",
      "pytest:tests/translate/test_constant_branches.py"),
    M("constant-branch-flat-mask", 'if p.op == "bcast" and (inner := ev.folded(p.args[0])) is not None:',
      "if False:", "a broadcast mask is negated under its broadcast: the table stays the reference's",
      "model:attention-scaled", "pytest:tests/translate/test_constant_branches.py"),
    # -- argmax of an increasing map, the pick at the argmax, 0/1 masks (translate/orders.py, picks.py) ---
    M("argmax-decreasing-step", 'INCREASING = {"exponential", "tanh", "logistic"}',
      'INCREASING = {"exponential", "tanh", "logistic", "negate"}',
      "argmax(-x) is argmin(x): only a strictly increasing step keeps the argmax",
      "model:router-negated", "pytest:tests/translate/test_order_facts.py::test_no_argmax_fact_for_other_maps"),
    M("argmax-scale-sign", 'if op in ("add", "subtract") or _positive(ev, b):', "if True:",
      "x * m and x / m keep the argmax only for m > 0",
      "pytest:tests/translate/test_order_facts.py::test_no_argmax_fact_for_other_maps"),
    M("argmax-shift-side", 'if op in ("add", "multiply") and _lane_constant(a, reduced)',
      'if op in ("add", "multiply", "subtract") and _lane_constant(a, reduced)',
      "m - x decreases in x: only x - m is a shift that keeps the argmax",
      "pytest:tests/translate/test_order_facts.py::test_no_argmax_fact_for_other_maps"),
    M("max-pick-argmax-only", "and orders.is_argmax(ev.module, reducer)", "",
      "the pick at an argmin is the min, not the max", "model:router-argmin",
      "pytest:tests/translate/test_order_facts.py::test_other_picks_are_no_max"),
    M("max-pick-increasing", "all(t is not z for t in orders.increasing_chain(ev, x, (v,)))", "False",
      "x[argmax(z)] is max(x) only when x keeps z's order (z itself or an increasing map of it)",
      "pytest:tests/translate/test_order_facts.py::test_other_picks_are_no_max"),
    M("idempotent-predicate", 'm.attrs[0] == "convert" and m.args[0].dtype == "pred")', 'm.attrs[0] == "convert")',
      "m * m = m only for m in {0, 1}: a converted predicate",
      "pytest:tests/translate/test_order_facts.py::test_a_value_that_is_not_zero_or_one_keeps_its_product"),
    M("unary-bcast-lift-op", "union(e).with_(T.bcast(spec, T.unary(op, x)))", "union(e).with_(T.bcast(spec, x))",
      "op(bcast(x)) is the broadcast of op(x), not of x: the op is moved, never dropped",
      rule_instance("elementwise/unary_bcast_lift")),
    M("root-reciprocal", 'moved = unary_terms(ev, "rsqrt", list(root.args)', 'moved = unary_terms(ev, "sqrt", list(root.args)',
      "x / sqrt(v) is x times the reciprocal root, not the root",
      "pytest:tests/translate/test_reciprocal_roots.py::"
      "test_a_quotient_by_a_root_is_stated_as_the_product_by_the_reciprocal_root"),
    M("root-only-sqrt", 'root.op != "unary" or root.attrs != ("sqrt",)', 'root.op != "unary"',
      "only a square root has rsqrt for its reciprocal: x / exp(v) is no x * rsqrt(v)",
      "pytest:tests/translate/test_reciprocal_roots.py::test_nothing_is_stated_for_other_divisors"),
    # -- sums of concatenations, sums over devices regrouped (translate/pieces.py, collectives.py) -----
    M("factor-beside-zeros", "held = {f for f, a in zip(factors, args) if self.uniform(a) != 0}",
      "held = {f for f, a in zip(factors, args) if self.uniform(a) is None}",
      "only a zero operand takes any factor: a constant one beside f * a is no multiple of f",
      "pytest:tests/translate/test_pieces.py::test_only_zeros_take_any_factor"),
    M("pieces-overlap", "    if any(prev[1] > nxt[0] for prev, nxt in zip(held, held[1:])):\n        return None\n", "",
      "zero-padded pieces are their concatenation only when no two non-zero pieces overlap",
      "pytest:tests/translate/test_pieces.py::test_overlapping_pieces_stay_a_sum"),
    M("pieces-same-cut", "if any(m.attrs[0] != dim or [p.shape[dim] for p in parts] != sizes for m, parts in zip(members, cut)):",
      "if any(m.attrs[0] != dim for m in members):",
      "concatenations are summed piece by piece only when cut at the same places",
      "pytest:tests/translate/test_pieces.py::"
      "test_an_all_reduce_of_values_concatenated_alike_is_the_concatenation_of_the_reduced_pieces"),
    M("pieces-under-factor", 'under = factor != 1 and base.op == "binary"', 'under = False and base.op == "binary"',
      "the op under a factor the builder moved in front has its pieces and signed form too: YaRN's factor on "
      "the cos/sin tables meets one on the rotated sum only there",
      "pytest:tests/translate/test_scaled_rotations.py::test_the_op_under_a_moved_factor_has_its_pieces_and_its_signed_form"),
    M("pieces-under-factor-operands", "*([(base, list(base.args))] if under else [])", "*([(base, args)] if under else [])",
      "the op under the factor is cut from its own operands, not from the written ones (which hold the factor)",
      "pytest:tests/translate/test_scaled_rotations.py::test_the_op_under_a_moved_factor_has_its_pieces_and_its_signed_form"),
    M("row-tables-inside", "    if found[0] < 0 or found[1] > table.shape[0] - 1:\n        return None\n", "",
      "a table's rows are its recipe on the rows read only where no read row lies past the table: HLO clamps there",
      "pytest:tests/translate/test_row_tables.py::test_a_table_read_past_its_rows_is_never_verified"),
    M("regroup-same-count", "if len(terms[0]) < 2 or any(len(t) != len(terms[0]) for t in terms):",
      "if len(terms[0]) < 2:",
      "device sums are regrouped term by term only when every device sums as many terms",
      "pytest:tests/translate/test_pieces.py::test_sums_over_devices_of_each_devices_sums_are_regrouped"),
    M("pieces-window-start", "parts = [build([window(ev, a, dim, lo, hi) for a in args]) for lo, hi in zip(bounds, bounds[1:])]",
      "parts = [build([window(ev, a, dim, lo, hi) for a in args[:1]] + [window(ev, a, dim, 0, hi - lo) for a in args[1:]])"
      " for lo, hi in zip(bounds, bounds[1:])]",
      "each piece of an elementwise op reads every operand at the same window: roll(x) * concat(-sin, sin) is not"
      " roll(x) * concat(-sin, -sin)",
      "pytest:tests/translate/test_rotation_pieces.py -k concatenation_of_the_pieces"),
    M("pieces-bcast-window", "inner = window(ev, t.args[0], k, start, stop)", "inner = window(ev, t.args[0], k, 0, stop - start)",
      "a broadcast's window is the broadcast of the window of its operand at the same offset",
      "pytest:tests/translate/test_rotation_pieces.py -k broadcast_concatenation"),
    # -- a sum over devices of one linear map of each device's value (translate/linear_sums.py) --------
    M("linear-sum-shared-add", 'return t.attrs[0] == "multiply" or (t.attrs[0] == "divide" and pos == 0)',
      'return t.attrs[0] in ("multiply", "add") or (t.attrs[0] == "divide" and pos == 0)',
      "a shared term added to each device's value is counted once per device: x + s is no linear map of x",
      "model:linear-tail-bias", "pytest:tests/translate/test_linear_sums.py -k shared-add"),
    M("linear-sum-divisor", '(t.attrs[0] == "divide" and pos == 0)', '(t.attrs[0] == "divide")',
      "a quotient is linear in its numerator only", "pytest:tests/translate/test_linear_sums.py -k divisor"),
    M("linear-sum-one-varying", "if len(varying) != 1:\n        return None\n    pos = varying[0]", "if not varying:\n        return None\n    pos = varying[0]",
      "with two operands differing between the devices (a device's own scale) the map is not shared",
      "model:linear-tail-device-gate", "pytest:tests/translate/test_linear_sums.py -k two_operands"),
    M("linear-sum-select-zero", "return ev.uniform(t.args[3 - pos]) == 0", "return True",
      "a select is linear in a branch only against zeros", "pytest:tests/translate/test_linear_sums.py -k select-one"),
    M("linear-sum-reduce-cut", "return [_mapped(ev, chain[:k], add(levels[k])) for k in cuts]",
      "return [_mapped(ev, chain[: max(k - 1, 1)], add(levels[k])) for k in cuts]",
      "a cut at the reductions keeps every map above them: sum_d g(reduce(y_d)) = g(sum_d reduce(y_d))",
      "pytest:tests/translate/test_linear_sums.py -k cut_at_the_reductions"),
    M("linear-sum-reducer", 'return t.attrs[0] == "add" and len(t.args) == 1', "return len(t.args) == 1",
      "only an add-reduce is linear: a max of sums is no sum of maxima",
      "pytest:tests/translate/test_linear_sums.py -k max-reduce"),
    # -- sums of signed terms in one form (translate/signed_sums.py) ----------------------------------
    M("signed-sum-subtract-sign", 'sign = 1 if base.attrs == ("add",) else -1', "sign = 1",
      "a subtracted term counts negatively: s - m - t is not s + m - t",
      "pytest:tests/translate/test_signed_sums.py -k other_coefficients"),
    M("signed-sum-negate-sign", "_collect(ev, base.args[0], -c, out, shape, limit, regrouped, reserved)",
      "_collect(ev, base.args[0], c, out, shape, limit, regrouped, reserved)",
      "a negation flips its operand's coefficients",
      "pytest:tests/translate/test_signed_sums.py -k written_orders"),
    # -- a product with a constant matrix that moves columns (translate/moved_columns.py) -------------
    M("moved-columns-one-non-zero", "if len(rows) > 1 or not np.all(np.isfinite(matrix[:, j])):",
      "if len(rows) > 2 or not np.all(np.isfinite(matrix[:, j])):",
      "a column with two non-zero entries adds two columns of x: it is no scaled window",
      "pytest:tests/translate/test_rotation_pieces.py -k two_non_zeros"),
    M("moved-columns-orientation", "right if spec.rhs_contract == (0,) else right.T",
      "right.T if spec.rhs_contract == (0,) else right",
      "x @ R contracts x's last dim with R's rows: column j of the product reads R's column j",
      "pytest:tests/translate/test_rotation_pieces.py -k moves_columns"),
    M("signed-sum-negated-factor", "_collect(ev, product, -c, out, shape, limit, regrouped, reserved)",
      "_collect(ev, product, c, out, shape, limit, regrouped, reserved)",
      "a negated factor negates the product: x1 * cos + (-x2) * sin is x1 * cos - x2 * sin",
      "pytest:tests/translate/test_rotation_pieces.py -k negated_factor"),
    M("signed-sum-spread-count", "count = Fraction(math.prod(operand.shape[k] for k in reduced))",
      "count = Fraction(1)",
      "a sum over R of a value constant along R is |R| times it: Σ (x - lse) = Σ x - V · lse",
      "pytest:tests/translate/test_signed_sums.py -k spread"),
    M("signed-sum-reserved-one-more", "reserved + len(terms) - 1 - i)", "reserved + len(terms) - i)",
      "a walk gives a sum up only when the atoms still to come take it past the budget: one atom more"
      " reserved drops the form of every sum of exactly the budget's atoms",
      "pytest:tests/translate/test_signed_sums.py -k exactly_the_budget"),
    M("signed-sum-walk-whole", "if len(out) + 1 + reserved > limit:", "if False:",
      "a sum past the budget is given up before its walk goes down (work counted, not a verdict: the"
      " residual stream walked whole at every layer is quadratic in the depth)",
      "pytest:tests/translate/test_signed_sums.py -k given_up_without_walking"),
    M("signed-sum-collective-atom", "if base not in ev.collective_sums and linear:", "if linear:",
      "an all-reduce's sum is one value of the reference, not its devices' pieces",
      "model:ce-signed-sum"),
    # -- an integer offset merged into the constant it is added to (translate/elementwise.py) ---------
    M("offset-merge-sign", "moved = _relaid(ev, *_offset_const(ev, b, signs[inner.attrs[0]] * c))",
      "moved = _relaid(ev, *_offset_const(ev, b, c))",
      "(x - c) + k is x + (k - c): a subtracted offset joins the constant negated",
      "pytest:tests/translate/test_position_offsets.py -k start-minus-offset"),
    M("offset-merge-uniform", "if ev.folded(b) is None or ev.uniform(b) is not None or ev.folded(a) is not None:",
      "if ev.folded(b) is None or ev.folded(a) is not None:",
      "a uniform offset stays on the start as written: the reference's dynamic slice at s + 2 is the window's base",
      "pytest:tests/translate/test_offset_windows.py::test_a_start_offset_by_a_constant_bounds_the_input_it_is_made_of"),
    M("offset-merge-subtracted-from", 'j = 0 if inner.attrs[0] == "add" and masks.scalar_int', "j = 0 if masks.scalar_int",
      "c - x is no offset of x: x counts negatively",
      "pytest:tests/translate/test_position_offsets.py -k subtracted_from"),
    # -- rows looked up by a one-hot product (translate/picks.py) -------------------------------------
    M("pick-one-hot-one-order", "for first in (False, True)]", "for first in (False,)]",
      "a program writes the one-hot first as often as last: both products are the pick",
      "model:pick-one-hot-first"),
    M("row-one-hot-bounds", "if found is None or found[0] < 0 or found[1] >= rows:",
      "if found is None or found[0] < 0 or found[1] > rows:",
      "an index past the table's last row is clamped by the gather and all zeros in the one-hot",
      "model:embed-one-hot-past-end"),
    # -- ops on values split in groups (a vmapped reference) ------------------------------------------
    M("regroup-reduce-split-dims", "        if any(k < 2 for k in dims):  # a reduce over the split dims mixes groups\n"
      "            return None\n", "",
      "only a reduce of the dims after the two split ones is the reduce of the unsplit rows",
      "pytest:tests/translate/test_regroup.py::test_only_ops_that_keep_the_groups_apart_are_regrouped[group-max]"),
    M("regroup-window-one-group", "    if parts.get(\"size\", [\"1\"])[0] != \"1\" or parts.get(\"pad\", [\"0_0\"])[0] != \"0_0\":\n"
      "        return None\n", "",
      "a windowed op is group by group only when its window spans one group",
      "pytest:tests/translate/test_regroup.py::test_only_ops_that_keep_the_groups_apart_are_regrouped[cross-group-cumsum]"),
    # -- a group's piece of a value computed group by group, and all_to_all of pieces ------------------
    M("group-piece-box", "((g, g + 1), *rest)", "((0, 1), *rest)",
      "group g's piece is the batched value's box g, not another group's",
      "pytest:tests/translate/test_group_pieces.py::test_each_groups_piece_is_the_term_its_device_computes_and_a_box_of_the_batched_value",
      "model:slots-a2a-swapped"),
    M("known-box-labels", "return numbers[whole][tuple(slice(a, b) for a, b in box)].reshape(piece.shape)",
      "return numbers[whole][tuple(slice(0, b - a) for a, b in box)].reshape(piece.shape)",
      "a piece is labelled by its own box of the batched value, not by the first one",
      "pytest:tests/translate/test_group_pieces.py::test_known_boxes_label_their_sources_by_the_whole", "model:slots-a2a-swapped"),
    M("rows-dot-contracted", "if spec.lhs_batch or 0 in spec.lhs_contract or", "if spec.lhs_batch or",
      "a dot takes rows of its result from rows of its lhs only when the lhs rows are free",
      "pytest:tests/translate/test_group_pieces.py::test_a_dot_that_contracts_the_rows_is_not_taken_row_by_row"),
    M("rows-bcast-moved", "if dims[:1] == (0,) and y.args[0].shape[:1] == (n,):", "if y.args[0].shape[:1] == (n,):",
      "a broadcast's rows are its operand's rows only when it keeps them in front",
      "pytest:tests/translate/test_group_pieces.py::test_a_broadcast_that_moves_the_rows_is_not_taken_row_by_row"),
    # -- one form for a dot: operand order, transposes moved out of reshapes, merged contractions ----
    M("swapped-dot-windows", 'expr = self.egg.call("slice", expr, perm.index(dim), start, stop)',
      'expr = self.egg.call("slice", expr, perm.index(dim), 0, stop - start)',
      "a window of a transposed dot is the same window of the dot with its operands swapped",
      "pytest:tests/translate/test_head_windows.py::test_a_transpose_of_windows_of_a_dot_is_the_windows_of_the_swapped_dot"),
    M("reorient-one-head", "if any(len(gi) > 1 for gi, _ in groups) or not any(sum(base.shape[j] > 1 for j in gj) > 1 for _, gj in groups):",
      "if any(len(gi) > 1 for gi, _ in groups):",
      "a device's one head inserted is a run of the other operand order where the reference's repeated KV heads are none",
      "pytest:tests/translate/test_head_windows.py::test_a_projection_with_one_head_inserted_keeps_its_written_order",
      "pytest:tests/translate/test_window_of_reshaped_window.py::test_gqa_picking_kv_heads_from_the_projection_verifies"),
    M("unit-leads-split", "key = (run[0], 0) if run else (later[0], g - len(runs)) if later else (key[0], key[1] + 1)",
      "key = (run[0], 0) if run else (key[0], key[1] + 1)",
      "a size-1 dim before a split leads it (a device's one group of heads), so the two programs' splits meet",
      "pytest:tests/translate/test_head_windows.py::test_a_unit_dim_before_a_split_leads_it_out_of_a_transpose",
      "pytest:tests/translate/test_head_windows.py::test_heads_inside_a_fused_weight_or_a_kv_group_verify[gqa-grouped]"),
    M("window-written-form",
      '# only through the written squeeze of the slot.\n            self.equal_terms.append(\n'
      '                [term, self.mk("reshape", (reshape_spec(operand.shape, shape.dims),), [operand], shape)]',
      "# only through the written squeeze of the slot.\n            self.equal_terms.append(\n                [term]",
      "a reshape found to be one window of its source keeps its written form (a device's one KV group's slot)",
      "pytest:tests/translate/test_grouped_qkv.py::test_a_squeezed_slot_of_one_group_is_the_reference_slot_narrowed_to_the_group",
      "pytest:tests/translate/test_grouped_qkv.py::test_whole_groups_of_a_group_major_fused_kernel_verify[sliced]"),
    M("relaid-dot-written-form", "ev.equal_terms.append([relaid, written])", "ev.equal_terms.append([relaid])",
      "a dot of relaid operands keeps its written form (the dot of a group's slot, windowed along the group)",
      "pytest:tests/translate/test_grouped_qkv.py::test_a_dot_of_relaid_operands_keeps_its_written_form_beside_it",
      "pytest:tests/translate/test_grouped_qkv.py::test_whole_groups_of_a_group_major_fused_kernel_verify[sliced]"),
    M("reduce-unit-dims", "if len(kept) < len(dims) and x.dtype == shape.dtype:", "if False:",
      "a reduce over size-1 dims among others is the others' reduction, reshaped (GQA's gradient on one KV head)",
      "model:gqa-grad", "model:gqa-grad-broadcast"),
    M("reduced-over-normal-form", "return reducer, x, tuple(sorted((*dims, *(k for k in kept if x.shape[k] == 1))))",
      "return None", "a reduction over size-1 dims among others is read through its normal form (a data shard's one group counted)",
      "model:grouped-sorted"),
    M("reduce-unit-dims-reducer", "return ev.reshape_term(reduce_term(ev, reducer, x, kept, others), shape)",
      'return ev.reshape_term(reduce_term(ev, "add", x, kept, others), shape)',
      "the reduction over the other dims keeps the reducer (a max over a KV head and its group stays a max)",
      "pytest:tests/translate/test_translation_against_xla.py::test_a_reduce_over_size_1_dims_among_others_computes_what_xla_computes"),
    M("swapped-squeeze", "swapped = self._swapped_squeeze(t.args[0], perm)", "swapped = None",
      "a transposed squeeze of windows of a dot is the squeeze of the windows of the dot with its operands swapped",
      "pytest:tests/translate/test_squeezed_slots.py::test_a_squeezed_slot_of_a_transposed_projection_is_a_window_of_the_swapped_dot",
      "pytest:tests/translate/test_squeezed_slots.py::test_slots_of_a_slot_major_projection_verify[per-slot]"),
    M("swapped-squeeze-order", "if residual == tuple(range(len(residual))):", "if True:",
      "a squeeze of the swapped dot's window in another order than the transpose's is transposed once more"
      " (heads and head_dim swapped are not the squeeze alone)",
      "pytest:tests/translate/test_squeezed_slots.py::"
      "test_a_transpose_out_of_the_swapped_dots_order_is_stated_with_the_rest_of_the_transpose",
      "pytest:tests/translate/test_squeezed_slots.py::test_a_squeezed_slot_of_a_transposed_projection_is_a_window_of_the_swapped_dot"),
    M("dot-reorient-window", "inner = ev.slice_term(inner, composed[dim], start, stop)",
      "inner = ev.slice_term(inner, dim, start, stop)",
      "a window of a dot read in the other operand order is taken along the dim its dim moved to",
      "pytest:tests/translate/test_dot_normal_form.py::test_windows_of_a_dot_read_in_the_other_order_move_with_its_dims"),
    M("dot-batch-order", "moved = {old: new for new, old in enumerate(order)}", "moved = dict(enumerate(order))",
      "a batch pair put in the lhs's order takes its output dim with it",
      "pytest:tests/translate/test_dot_normal_form.py::test_a_dot_read_by_a_dot_has_its_batch_pairs_in_the_lhs_order"),
    M("slice-transpose-dim", "inner = self.slice_term(x.args[0], perm[dim], start, stop)",
      "inner = self.slice_term(x.args[0], dim, start, stop)",
      "a window of a transpose is the window of its operand along the dim the transpose moved there",
      "pytest:tests/translate/test_dot_normal_form.py::test_a_window_of_a_transpose_is_a_transpose_of_the_window"),
    M("reshape-transpose-run", "if any(run and run != list(range(run[0], run[0] + len(run))) for run in runs):",
      "if False:",
      "a reshape moves out of a transpose only where each group it splits or merges is a run of the operand's dims",
      "pytest:tests/translate/test_dot_normal_form.py::test_a_reshape_merging_dims_out_of_order_stays_a_reshape",
      "pytest:tests/translate/test_dot_normal_form.py::test_near_misses_of_the_dot_form_are_mismatches[merge-unmoved]"),
    M("reshape-transpose-perm", "perm = tuple(dims.index(j) for j in range(len(shape.dims)))", "perm = tuple(dims)",
      "the transpose moved out puts each output dim back from its place in the reshaped operand",
      "pytest:tests/translate/test_dot_normal_form.py::test_a_reshape_of_a_transpose_along_runs_is_a_transpose_of_a_reshape"),
    M("transpose-splat-only", "or not value.size or not all_equal(value):", "or not value.size:",
      "only a splat is the same in every layout",
      "pytest:tests/translate/test_group_pieces.py::test_an_op_on_a_transposed_value_and_a_splat_is_the_transposed_op[max-of-a-row]",
      "pytest:tests/translate/test_unary_through_reshapes.py -k keepdims"),
    # -- unrolled loops and scatters at constant indices ---------------------------------------------
    M("unroll-devices-agree", "return found.pop() if len(found) == 1 else None", "return found.pop()",
      "a loop is unrolled only when every device runs it the same number of times",
      "pytest:tests/prove/test_unroll.py::test_near_misses_are_mismatches[trips]"),
    M("scatter-overlap", "return None  # overlapping writes: which one wins is unspecified", "pass",
      "two writes of one slot are in no specified order",
      "pytest:tests/prove/test_unroll.py::test_two_writes_to_one_slot_are_not_taken_in_program_order"),
    M("scatter-drop-out-of-range", "if any(s < 0 or s + n > full for s, n, full in zip(starts, sizes, x.shape)):\n"
      "            continue", "starts = [min(max(s, 0), full - n) for s, n, full in zip(starts, sizes, x.shape)]",
      "a scatter skips an update whose window leaves the operand (it does not clamp)",
      "pytest:tests/prove/test_unroll.py::test_near_misses_are_mismatches[dropped]"),
    M("scatter-overwrite-only",
      'adds = reducer_of(ev.module, inst) == "add"\n    if not adds and not overwrites(called(ev.module, inst, "to_apply")):',
      "adds = False\n    if False:",
      "only a scatter that overwrites is a window write (one that adds is not)",
      "pytest:tests/prove/test_unroll.py::test_near_misses_are_mismatches[added]"),
    M("scatter-add-keeps-operand", "if adds and ev.uniform(here := ev.slice_nd(x, box)) != 0:", "if False:",
      "a scatter that adds into a non-zero operand keeps the operand's window in the sum",
      "pytest:tests/prove/test_unroll.py::test_near_misses_are_mismatches[added]"),
    M("scatter-max-not-a-write", 'if not adds and not overwrites(called(ev.module, inst, "to_apply")):', "if False:",
      "only a scatter that overwrites (or adds) is a window write (one that takes a max is neither)",
      "pytest:tests/prove/test_unroll.py::test_near_misses_are_mismatches[maxed]"),
    # -- dynamic slices at offsets from a bounded start (translate/offsets.py) -------------------------
    M("offset-window-clamp", "    if not (0 <= lo + c and hi + c <= n - size):  # some value of the base would clamp\n"
      "        return None\n", "",
      "a start offset from a bounded base is a window of one dynamic slice only where HLO never clamps it",
      "pytest:tests/translate/test_offset_windows.py::test_offset_window_refuses_a_start_that_may_clamp"),
    M("slice-start-domain", "ev.index_uses.append((plain, x.shape[dim] - sizes[dim] + 1,",
      "ev.index_uses.append((plain, x.shape[dim] - sizes[dim],",
      "a slice start is assumed valid over [0, n - size], every start the reference reads without clamping",
      "pytest:tests/translate/test_offset_windows.py::test_offset_slices_verify[sp]"),
    M("consecutive-rows-only", "or not np.array_equal(c, c[0] + np.arange(c.size))", "",
      "only a gather of consecutive rows (p + c0 + arange(n)) is a window of the table",
      "pytest:tests/translate/test_offset_windows.py::test_offset_near_misses_are_mismatches[take-swapped]"),
    M("offset-index-domain", "lo, hi = float(-offsets.min()), float(size - 1 - offsets.max())",
      "lo, hi = 0.0, float(size - 1)",
      "p + c is a valid index for every offset c only for p in [-min c, size - 1 - max c]",
      "pytest:tests/translate/test_offset_windows.py::test_offset_slices_verify[take]"),
    M("affine-bounds-difference", "ev._set_bounds(term, ra[0] - rb[1], ra[1] - rb[0])",
      "ev._set_bounds(term, ra[0] - rb[0], ra[1] - rb[1])",
      "the difference of two intervals runs from lo_a - hi_b to hi_a - lo_b",
      "pytest:tests/translate/test_offset_windows.py::test_affine_bounds_hold_every_result[subtract]"),
    # -- lookups at ids - lo by a gather that clamps its own index (translate/masks.py) ---------------
    M("take-clip-not-a-lookup", "    return Window(ids, shift, shift + size).clipped(ev.bounds_of(ids)), shift\n",
      "    return None\n",
      "a gather at ids - c of the shard's rows, masked to the shard's ids, is the full table's lookup there",
      "model:embed-take-clip"),
    # -- a lookup's window along its indexed dim under a window along another (translate/windows.py) ---
    M("window-along-other-dim", "    if w is None or w.dim == dim:\n        return w\n", "    if True:\n        return w\n",
      "a gather along one dim reads a window of the table only along that dim",
      "pytest:tests/translate/test_two_axis_lookups.py::test_vocab_pick_on_data_rows_verifies[clip]"),
    M("window-along-outer-start", "whole=ev.slice_term(inner.whole, w.dim, w.start, w.stop)",
      "whole=ev.slice_term(inner.whole, w.dim, 0, w.stop - w.start)",
      "windows along two dims commute, each keeping its own start",
      "pytest:tests/translate/test_two_axis_lookups.py::test_vocab_pick_on_data_rows_verifies[clip]"),
    # -- a gather's size-1 window dims as batching dims (terms/spec.py, GatherDims) -----------------------
    M("unit-window-any-size", "if k not in window or k in dims.start_map or operand_shape[k] != 1:",
      "if k not in window or k in dims.start_map:",
      "only a size-1 window dim holds the one element a size-1 batch row does",
      "pytest:tests/terms/test_semantics_against_jax.py::test_a_window_dim_longer_than_one_or_read_by_an_index_stays_a_window"),
    M("unit-window-read", "if k not in window or k in dims.start_map or operand_shape[k] != 1:",
      "if k not in window or operand_shape[k] != 1:",
      "a window dim a start index reads is no batch row",
      "pytest:tests/terms/test_semantics_against_jax.py::test_a_window_dim_longer_than_one_or_read_by_an_index_stays_a_window"),
    # -- a filling take at ids sent past the shard (translate/masks.py, through_select, known_rows) -----
    M("fill-constant-inside", "any(w.lo <= int(v) < w.hi for v in np.unique(value))", "False",
      "a window test of select(p, k, ids - c) is a test of the ids only where k fails it",
      "pytest:tests/translate/test_fill_takes.py -k through_a_select"),
    M("fill-rows-unreshaped", "    return MaskedRows(ev.reshape_term(inner.full, shape), inner.window, inner.labels.reshape(rows.shape))\n",
      "    return inner\n",
      "a reshape of a lookup is the reshape of the full lookup, each element's index kept",
      "pytest:tests/translate/test_fill_takes.py::test_a_filling_take_at_the_ids_sent_past_the_shard_verifies[xent_fill]"),
    # -- reductions with a negation or a size-1 reshape moved out (translate/reductions.py) -------------
    M("reduce-negation-dropped",
      'term = ev.normal("unary", ("negate",), [reduction(ev, reducer, y, dims, shape)], shape)',
      "term = reduction(ev, reducer, y, dims, shape)",
      "a sum of negations is the negated sum, never the sum",
      "pytest:tests/translate/test_moved_reductions.py::test_near_misses_of_moved_reductions_are_mismatches[xent_gathered_unsigned]"),
    M("reduce-reshaped-any-unary",
      'if x.op == "reshape" and x.args[0].op == "unary" and x.args[0].attrs == ("negate",):',
      'if x.op == "reshape" and x.args[0].op == "unary":',
      "a sum of a reshape of negations is the negated sum, never of a reshape of another op",
      "pytest:tests/translate/test_moved_reductions.py::test_each_moved_reduction_computes_what_xla_computes[exp-reshaped-sum]"),
    M("reduce-unit-dims-first", "ydims = tuple(narrow[wide.index(k)] for k in dims if k in wide)",
      "ydims = tuple(narrow[: len([k for k in dims if k in wide])])",
      "a size-1 reshape keeps the order of the other dims: each reduced dim maps to its own",
      "pytest:tests/translate/test_moved_reductions.py::test_near_misses_of_moved_reductions_are_mismatches[column_sums_of_rows]"),
    M("moved-reductions-none", "        if moved is not term:\n            ev.equal_terms.append([term, moved])\n",
      "        pass\n",
      "a loss negated after its mean over [T, 1] meets the reference's negation before its mean over [T]",
      "pytest:tests/translate/test_moved_reductions.py::test_a_negation_or_a_size_one_dim_outside_the_reduction_verifies"),
    # -- a division by a count in one normal form (translate/builder.py) ------------------------------
    M("divided-odd-part", "numerator, divisor = self.scaled(base, ratio * odd), self.splat(Fraction(odd), shape)",
      "numerator, divisor = self.scaled(base, ratio * odd), self.splat(Fraction(odd + 2), shape)",
      "(f * x) / c is (a * x) / b only with a / b = f / c",
      "pytest:tests/translate/test_evaluator.py::test_a_division_by_a_count_has_one_form_however_it_is_written"),
    M("quotient-sum-one-factor",
      "if linear and len(held) == 1 and (factor := held.pop()).denominator & (factor.denominator - 1):",
      "if linear and len(held) >= 1 and (factor := held.pop()).denominator & (factor.denominator - 1):",
      "quotients summed are the quotient of their sum only when they share one factor",
      "pytest:tests/translate/test_evaluator.py::test_quotients_by_one_count_summed_or_scaled_have_one_form"),
    M("quotient-factor-times-count", "                return factor / c, base\n", "                return factor * c, base\n",
      "(a * x) / c is the factor a / c of x, not a * c",
      "pytest:tests/translate/test_evaluator.py::test_quotients_by_one_count_summed_or_scaled_have_one_form",
      "pytest:tests/translate/test_training_losses.py"),
    # -- scalings by powers of two at other places: odd parts in, the power of two in front (builder.py) --
    M("times-power-dropped", "return self.scaled(inner, front)", "return inner",
      "a product of factors that is no number of the dtype keeps its power of two in front",
      "pytest:tests/translate/test_evaluator.py::test_scalings_by_powers_of_two_at_other_places_leave_one_base",
      "model:gelu-dp-grad-halved"),
    M("times-front-undivided", "            front /= part\n", "",
      "each significand moved inside leaves the product over it in front, not the whole product",
      "pytest:tests/translate/test_optimizer_factors.py::test_many_constant_factors_leave_one_base_and_a_power_of_two_in_range"),
    M("select-splat-kept", "return c, self.const(np.ones(t.shape, NP_DTYPES[t.dtype]), t.dtype)", "return c, t",
      "select(p, c, 0) is c times the select of ones, not of c again",
      "pytest:tests/translate/test_optimizer_factors.py::test_a_select_of_a_splat_beside_zero_is_the_splat_times_the_select_of_one"),
    M("product-operand-quotient", 'quotients = op != "multiply"', "quotients = True",
      "a product keeps its operands' constant factors in front: an Adam second moment of a [F, 1] gradient",
      "pytest:tests/translate/test_optimizer_steps.py -k adam-dp"),
    M("bcast-scaled-any-factor", "        power_of_two_splat(v),\n        reference(z),\n", "        reference(z),\n",
      "the scaled wider broadcast a narrow one is read as a window of holds the builder's exact factor (a power of two)",
      "pytest:tests/terms/test_rules_numeric.py::test_a_narrow_broadcast_is_a_window_of_a_scaled_reference_broadcast"),
    M("sum-odd-parts-twice", "first, second = (self.times(b, f / front) for f, b in zip(factors, bases))",
      "first, second = (self.times(b, f) for f, b in zip(factors, bases))",
      "f * a + g * b = p * ((f / p) * a + (g / p) * b): each operand keeps its factor over p only",
      "pytest:tests/translate/test_evaluator.py::test_pulled_out_factor_is_an_identity[add_inexact_ratio]"),
    # -- roundings to a narrower float moved across a sum (translate/reductions.py, collectives.py) ----
    M("bf16-dot-unrounded", 'return ev.normal("unary", ("convert",), [wide], inst.shape)', "return wide",
      "a dot with a bf16 result is its f32 dot rounded: the rounding stays",
      "pytest:tests/translate/test_rounded_sums.py::test_near_miss_bf16_psum_where_the_reference_keeps_f32_is_not_verified"),
    M("rounded-sum-one-member",
      'total = combine(ev, "add", [m.args[0].args[0] if narrow != m.dtype else m.args[0] for m in members])',
      'total = combine(ev, "add", [m.args[0].args[0] if narrow != m.dtype else m.args[0] for m in members[:1]])',
      "the rounding of a sum over devices sums every device's unrounded value",
      "pytest:tests/translate/test_rounded_sums.py::test_a_sum_of_values_rounded_to_bf16_is_stated_as_their_sum_rounded"),
    M("round-trip-any-dtype",
      "return (inner.dtype, wide) if wide == t.dtype and wide in WIDER[inner.dtype] else None",
      "return (inner.dtype, wide)",
      "a round trip goes back to the dtype it came from, through a narrower one",
      "pytest:tests/translate/test_rounded_sums.py::test_no_round_trip_is_stated_through_another_dtype_or_back_to_another"),
    # -- the power of two of a factor moved out of roundings (translate/roundings.py) ----------------
    M("rounding-whole-factor-moved", "if factor == 0 or (front := power_of_two(factor)) == 1:",
      "if factor == 0 or (front := factor) == 1:",
      "only a power of two commutes with a rounding: round(3 x) is no 3 round(x)",
      "pytest:tests/translate/test_scaled_roundings.py::test_near_miss_a_rounding_moved_across_three_or_a_weight_is_not_verified"),
    M("rounding-power-dropped", "return ev.scaled(inner, front)", "return inner",
      "the power of two moved out of the rounding stays in front of it",
      "pytest:tests/translate/test_scaled_roundings.py::test_the_translator_moves_only_the_power_of_two_and_computes_what_xla_computes",
      "pytest:tests/translate/test_scaled_roundings.py::test_near_miss_scales_and_averages_are_mismatches"),
    M("rounding-odd-part-dropped", "inner = ev.scaled(base, factor / front)", "inner = base",
      "the odd part of the factor stays inside the rounding",
      "pytest:tests/translate/test_scaled_roundings.py::test_the_translator_moves_only_the_power_of_two_and_computes_what_xla_computes"),
    # -- psum is linear; plain sums in one order (translate/collectives.py, signed_sums.py) ------------
    M("plain-form-coefficient-dropped", "part = _signed(ev, atom, c, shape)", "part = _signed(ev, atom, Fraction(1), shape)",
      "each term of a plain sum keeps its coefficient in the form",
      "pytest:tests/translate/test_psum_of_sums.py::test_a_plain_sum_with_a_psum_of_sums_is_built_in_one_order_and_is_the_written_sum"),
    M("broadcast-difference-added", 'return [(1, first), (1 if inner.attrs == ("add",) else -1, second)]',
      "return [(1, first), (1, second)]",
      "bcast(b1 - b2) subtracts the broadcast b2",
      "pytest:tests/translate/test_psum_of_sums.py::test_a_broadcast_sum_is_the_sum_of_the_broadcasts_and_a_broadcast_difference_is_signed"),
    M("regrouped-psum-one-column", "ev.regrouped_sums[base] = summed",
      'ev.regrouped_sums[base] = summed.args[0] if summed.op == "binary" else summed',
      "an all-reduce of the devices' sums adds up every term's all-reduce",
      "pytest:tests/translate/test_psum_of_sums.py::test_a_plain_sum_with_a_psum_of_sums_is_built_in_one_order_and_is_the_written_sum",
      "pytest:tests/translate/test_psum_of_sums.py::test_near_miss_partials_and_biases_reduced_otherwise_are_mismatches"),
    M("plain-form-written-order", "ordered = sorted(atoms, key=lambda item: ev.inputs_of(item[1]))", "ordered = atoms",
      "the terms of a plain sum are put in one order, whatever order the program wrote",
      "pytest:tests/translate/test_psum_of_sums.py::test_one_psum_of_both_branches_partials_verifies",
      "pytest:tests/translate/test_signed_sums.py::test_a_plain_sum_gives_no_signed_form_but_its_terms_in_input_order"),
    # -- a scaling by a power of two undone (terms/rules/elementwise.py, terms/load.py) ----------------
    M("cancel-any-factor",
      "return abs(numerator) & (abs(numerator) - 1) == 0 and denominator & (denominator - 1) == 0",
      "return True",
      "only a power of two cancels exactly: 3x = 3y in f32 for neighbouring x, y",
      "pytest:tests/prove/test_cancelled_scales.py::test_near_miss_other_factors_cancel_nothing"),
    M("cancel-zero", "if value == 0 or not math.isfinite(value):", "if not math.isfinite(value):",
      "0 * x = 0 * y for every x and y",
      "pytest:tests/prove/test_cancelled_scales.py::test_near_miss_other_factors_cancel_nothing"),
    M("cancel-integer", 'if t.op != "const" or t.shape != () or t.dtype not in FLOATS:',
      'if t.op != "const" or t.shape != ():',
      "an integer product wraps: 2x = 2y mod 2^32 for x and y 2^31 apart",
      "pytest:tests/prove/test_cancelled_scales.py::test_near_miss_other_factors_cancel_nothing"),
    M("cancel-concludes-nothing", "union(x).with_(y)", "power_of_two_splat(x)",
      "a value proved equal only under its power-of-two factor is equal without it (the batch mean needs it)",
      "pytest:tests/prove/test_cancelled_scales.py::test_the_batch_mean_of_a_smoothed_vocab_parallel_loss_verifies",
      "pytest:tests/terms/test_rules_numeric.py::test_rule_fires_and_is_an_identity"),
    # -- constants known as windows of several tables (translate/constants.py) ------------------------
    M("constant-window-other-source-unchecked",
      "if np.array_equal(window.reshape(view.shape), view, equal_nan=True):",
      "if new_source or np.array_equal(window.reshape(view.shape), view, equal_nan=True):",
      "a window of a further table is stated equal only where its elements are the constant's",
      "pytest:tests/translate/test_constant_windows.py::test_near_miss_rows_one_table_holds_are_no_window_of_the_other"),
    # -- running sums of windows, reductions over pieces (translate/cumsums.py, reductions.py) --------
    M("running-sum-before-short", "before = _sum_along(ev, ev.slice_term(whole, dim, 0, start), dim)",
      "before = _sum_along(ev, ev.slice_term(whole, dim, 0, start - 1), dim)",
      "a window's running sum lacks the sum of everything before the window, not of all but one",
      "pytest:tests/translate/test_running_sums.py::test_a_running_sum_of_a_window_is_the_window_less_what_precedes_it"),
    M("running-sum-any-padding", "return k if sizes[k] == n and tuple(pads[k]) == (n - 1, 0) and n > 1 else None",
      "return k if sizes[k] == n and n > 1 else None",
      "only a window padded n - 1 before (not a reversed scan) is a running sum whose last row is the total",
      "pytest:tests/translate/test_running_sums.py::test_near_miss_the_last_row_of_a_reversed_running_sum_is_no_total",
      "pytest:tests/translate/test_running_sums.py::test_near_miss_windowed_sums_that_are_no_running_sums_state_nothing"),
    M("running-sum-lanes-own-dim", "    if lifted is not None and lifted.dim != dim and lifted.whole.dtype == x.dtype:",
      "    if lifted is not None and lifted.whole.dtype == x.dtype:",
      "only a window along another dim than the summed one is the window of the whole's running sum; along "
      "the summed dim it lacks what precedes it",
      "pytest:tests/translate/test_running_sums.py::test_every_stated_running_sum_of_nested_windows_holds"),
    # -- a product by a constant mask as windows and zeros (translate/constant_selects.py) -------------
    M("masked-product-any-factor", "    if all_equal(value) or not np.all((value == 0) | (value == 1)):",
      "    if all_equal(value):",
      "only a constant of ones and zeros keeps x's windows and zeros: a factor 2 is no mask",
      "pytest:tests/translate/test_slot_counts.py::test_near_miss_other_constant_factors_stay_products"),
    # -- a unit window of a broadcast along the dim it adds (translate/builder.py) ----------------------
    M("unit-bcast-window-any-dim", "and stop - start == 1 and self._only_new_dim(x, dim):",
      "and stop - start == 1:",
      "only along the one dim a broadcast adds is a unit window its operand reshaped; along the operand's "
      "own dim it is the operand's window",
      "pytest:tests/translate/test_slot_counts.py::test_a_unit_window_of_a_broadcast_along_the_dim_it_adds_is_a_reshape"),
    # -- a scan's stacked states: reshapes and transposes of concatenations (translate/builder.py) ----
    M("reshaped-parts-unlabelled", "if np.array_equal(joined_labels, whole.reshape(out)):", "if True:",
      "a reshape of a concatenation that splits or merges the joined dim is the concatenation of the "
      "reshaped parts only where the labels show each part is a run of whole slabs",
      "pytest:tests/translate/test_scan_stacks.py::test_a_reshape_of_parts_that_are_whole_slabs_is_their_concatenation"),
    M("transposed-part-any-dims-reshaped", "return kept == sorted(kept)", "return True",
      "only a transpose that moves size-1 dims alone keeps the row-major order, and so is a reshape",
      "pytest:tests/translate/test_scan_stacks.py::test_a_transpose_of_a_concatenation_is_the_concatenation_of_transposes"),
    # -- prefix sums over a sharded sequence (translate/windows.py, reductions.py) -------------------
    M("dot-batch-window-any-range",
      "if own is not None and (own.dim, own.start, own.stop) == (dims[out], w.start, w.stop):",
      "if own is not None and own.dim == dims[out]:",
      "a dot's operands must be windows of one range along the batch dims they pair",
      "pytest:tests/translate/test_prefix_sums.py::test_near_miss_a_dot_of_windows_of_different_ranges_is_no_window"),
    M("kept-pieces-any-weights", "if held is None or m.dtype not in FLOATS or not np.all((held == 0) | (held == 1)):",
      "if held is None or m.dtype not in FLOATS or not np.all(held >= 0):",
      "only a mask of ones and zeros picks pieces whole: other weights scale them",
      "pytest:tests/translate/test_prefix_sums.py::test_near_miss_a_dot_with_a_mask_of_other_numbers_states_no_pieces"),
    M("zero-dot-any-uniform", "any(len(x.shape) == n and ev.uniform(x) == 0 for x, n in selectors)",
      "any(len(x.shape) == n and ev.uniform(x) is not None for x, n in selectors)",
      "only a dot with a selector zero everywhere is zero",
      "pytest:tests/translate/test_prefix_sums.py::test_a_dot_with_a_mask_of_ones_and_zeros_is_the_sum_of_the_kept_pieces"),
    M("merged-totals-gap", "if any(w.stop != nxt.start for w, nxt in zip(pieces, pieces[1:])):",
      "if any(w.stop > nxt.start for w, nxt in zip(pieces, pieces[1:])):",
      "totals of windows merge into the total of their union only where the windows leave no gap",
      "pytest:tests/translate/test_prefix_sums.py::test_near_miss_totals_that_do_not_tile_a_window_state_no_union"),
    M("reduced-pieces-any-constant", "kept = [p for p in found[1] if not _identity(ev, reducer, p)]",
      "kept = [p for p in found[1] if ev.folded(p) is None]",
      "only pieces of the reducer's identity are left out of a reduction over pieces",
      "pytest:tests/translate/test_translation_against_xla.py::test_translated_terms_compute_what_xla_computes"),
    M("reduce-any-constant-is-identity", "if _identity(ev, reducer, x):  #",
      "if ev.folded(x) is not None:  #",
      "a reduction folds to the identity only when every element is the identity",
      "pytest:tests/translate/test_translation_against_xla.py::test_translated_terms_compute_what_xla_computes"),
    M("plus-any-constant-is-itself",
      "if ev.uniform(args[k]) == 0 and args[1 - k].shape == term.shape and args[1 - k].dtype == term.dtype:",
      "if ev.uniform(args[k]) is not None and args[1 - k].shape == term.shape and args[1 - k].dtype == term.dtype:",
      "x + c is stated equal to x only for c = 0",
      "pytest:tests/translate/test_running_sums.py::test_carries_of_other_shards_are_mismatches"),
    # -- complex values as pairs of real ones (translate/complex_pairs.py) ----------------------------
    M("complex-product-sign", "[(1, f(a, c)), (-1, f(b, d))]", "[(1, f(a, c)), (1, f(b, d))]",
      "the real part of (a + bi)(c + di) is ac - bd",
      "pytest:tests/translate/test_translation_against_xla.py -k complex"),
    M("complex-imag-part", 'return split[0][0 if op == "real" else 1]', "return split[0][0]",
      "imag of a pair is its second part",
      "pytest:tests/translate/test_translation_against_xla.py -k complex"),
    M("complex-quotient-per-part", "    elif op in MOVES:\n", '    elif op in MOVES or op == "divide":\n',
      "only sums and ops that move elements act part by part (a complex quotient does not)",
      "pytest:tests/translate/test_complex_pairs.py -k quotient"),
    # -- a dot of a quotient as the quotient of the dot (translate/quotients.py) ------------------------
    M("quotient-contracted", "own_free = [k for k in range(rank) if k not in batch and k not in contract]",
      "own_free = [k for k in range(rank) if k not in batch]",
      "only a divisor constant along the contraction comes out of the dot's sum",
      "pytest:tests/translate/test_quotients.py -k numerically"),
    M("quotient-float", "    if inst.shape.dtype not in FLOATS or any(", "    if any(",
      "an integer quotient truncates: (a / z) summed is not the sum divided",
      "pytest:tests/translate/test_quotients.py -k integer"),
    M("quotient-rhs-offset", "start = len(batch) + (spec.lhs_rank - len(spec.lhs_batch) - len(spec.lhs_contract) if side == 1 else 0)",
      "start = len(batch)", "the right operand's free dims come after the left's in the dot's output",
      "pytest:tests/translate/test_quotients.py -k numerically"),
    # -- transpose(x) op bcast(y) as the transpose of x op bcast(y) laid out as x (translate/elementwise.py)
    M("transposed-bcast-layout", "dims = [perm[at[i]] for i in range(len(y.shape))]",
      "dims = [at[i] for i in range(len(y.shape))]",
      "the broadcast's dims move with the transpose: laid out as x, y's dim sits where the transpose takes it from",
      "pytest:tests/translate/test_transposed_quotients.py"),
    M("transposed-bcast-compose", "dims = [dims[inner.index(j)] for j in range(len(inner))]",
      "dims = [dims[inner[j]] for j in range(len(inner))]",
      "a broadcast of transpose(z) is a broadcast of z through the inverse permutation (a 3-cycle tells them apart)",
      "pytest:tests/translate/test_transposed_quotients.py"),
    # -- online softmax rescaled to the running max (translate/shifts.py) ------------------------------
    M("shift-same-old", "if a is not old or new.shape != old.shape", "if new.shape != old.shape",
      "exp(s - a) * exp(a' - b) is exp(s - b) only for a' = a",
      "pytest:tests/translate/test_shifts.py -k block-max"),
    M("shift-factor-dims", "or tuple(out_of.get(k) for k in at) != dims:", ":",
      "the factor must multiply each exponential at the row its shift belongs to",
      "pytest:tests/translate/test_shifts.py -k across"),
    # -- a jit-partitioned pick: ids read through the reshape XLA adds, factors read inside (translate/masks.py)
    M("lookup-ids-unreshaped", "    w = _unreshaped(ev, w)\n    full_idx", "    full_idx",
      "the lookup's window must name the ids its mask tests, which masks read through reshapes",
      "pytest:tests/translate/test_partitioned_picks.py -k plain"),
    M("known-rows-factor", "(inner_rows := ev.scaled(base.args[0], factor))", "(inner_rows := base.args[0])",
      "c * reshape(y) is the lookup reshape(c * y) only with the factor moved inside, never dropped",
      "pytest:tests/translate/test_partitioned_picks.py -k capped"),
    # -- exp(u - log s) as exp(u) / s for a positive s (translate/log_quotients.py) ---------------------
    M("log-quotient-positive", 't.attrs != ("log",) or not positive(ev, t.args[0]):', 't.attrs != ("log",):',
      "exp(u - log s) is exp(u) / s only for s > 0: log s is NaN below zero, where the quotient is a number",
      "pytest:tests/translate/test_log_quotients.py -k log_of_input"),
    M("log-quotient-subtracted", "if c == -1 and (s := _log_argument(ev, a))", "if abs(c) == 1 and (s := _log_argument(ev, a))",
      "only a subtracted log divides: exp(u + log s) is exp(u) * s",
      "pytest:tests/translate/test_log_quotients.py -k log_added"),
    M("positive-scale-sign", "return factor > 0 and positive(ev, base)", "return positive(ev, base)",
      "a negative factor makes a positive value negative",
      "pytest:tests/translate/test_log_quotients.py -k negated_scale"),
    M("positive-unary-exp", 'return t.attrs == ("exponential",) or (', 'return t.attrs != ("log",) or (',
      "of the unary ops only exp (and abs of a positive value) is positive: sin is not",
      "pytest:tests/translate/test_log_quotients.py -k log_of_sine"),
    M("positive-difference", 'POSITIVE_OF_POSITIVE = (("add",),', 'POSITIVE_OF_POSITIVE = (("add",), ("subtract",),',
      "a difference of positive values may be zero or negative",
      "pytest:tests/translate/test_log_quotients.py -k log_of_difference"),
    M("unit-reshape-floats", "    if any(a.dtype not in FLOATS for a in args) or all(", "    if all(",
      "index arithmetic keeps its written form, which the one-hot facts read",
      "pytest:tests/translate/test_index_compares.py -k broadcast_operand"),
    M("outside-factor-kept", "            moved = ev.scaled(base.args[0], factor)", "            moved = base.args[0]",
      "a constant factor in front of a broadcast (or reshape) goes inside it with the op, never dropped",
      "pytest:tests/translate/test_broadcast_outside.py -k factor",
      "pytest:tests/translate/test_keepdims_statistics.py::"
      "test_an_op_on_a_scaled_keepdims_value_is_the_op_on_the_scaled_value_reshaped"),
    M("outside-broadcast-dims", "key=lambda pair: pair[1]))\n    return broadcast_term", "key=lambda pair: pair[0]))\n    return broadcast_term",
      "the op's broadcast puts each operand dim where the written broadcast put it (a broadcast that moves dims tells them apart)",
      "pytest:tests/translate/test_broadcast_outside.py -k broadcast_of_the_op"),
    # -- HLO conditional (translate/conditionals.py) ----------------------------------------------------
    M("cond-index-clamp", "return k if 0 <= k < n else n - 1", "return k % n",
      "XLA runs the last branch for an index outside [0, n)",
      "pytest:tests/translate/test_conditionals.py -k out_of_range"),
    M("cond-predicate-branch", "return 0 if k else 1", "return 1 if k else 0",
      "a true predicate takes the true branch (listed first)",
      "pytest:tests/translate/test_conditionals.py -k out_of_range"),
    M("cond-select-chain", "acc = _select(ev, test, values[k], acc, shape)", "acc = _select(ev, test, acc, values[k], shape)",
      "index i == k selects branch k, else the chain of the later branches",
      "pytest:tests/translate/test_conditionals.py -k xla"),
    M("cond-collective-branch", "if not uniform and any(", "if False and any(",
      "a collective in a branch that only some devices take cannot be evaluated in lock step",
      "pytest:tests/translate/test_conditionals.py -k collective"),
    # -- a dot of a scaled operand (translate/scaled_dots.py) -------------------------------------------
    M("scaled-dot-contracted", "free = [d for d in range(rank) if d not in batch and d not in contract]",
      "free = [d for d in range(rank) if d not in batch]",
      "a scale along a contracted dim varies inside the sum: it does not come out of the dot",
      "pytest:tests/translate/test_scaled_dots.py -k not_moved"),
    M("scaled-dot-divisor", '_SCALE_AT = {"multiply": (0, 1), "divide": (1,)}', '_SCALE_AT = {"multiply": (0, 1), "divide": (0, 1)}',
      "w / s is w scaled by 1 / s; s / w is no scale of w",
      "pytest:tests/translate/test_scaled_dots.py -k not_moved"),
    M("scaled-dot-integer-divide", 'if op == "divide" and inst.shape.dtype not in FLOATS:', "if False:",
      "an integer quotient truncates each product: the sum of quotients is not the quotient of the sum",
      "pytest:tests/translate/test_quotients.py -k integer"),
    M("transposed-scalar-quotient", "return found[0], dot_term(ev, spec, plain[0], plain[1], Shape(x.dtype, x.shape)), found[2]",
      'return "multiply", dot_term(ev, spec, plain[0], plain[1], Shape(x.dtype, x.shape)), found[2]',
      "a dot of an operand divided by s is the dot divided by s, not multiplied",
      "pytest:tests/translate/test_contrastive_losses.py -k divided"),
    # -- a sum of products of one left factor (translate/factored_dots.py) ----------------------------
    M("factored-dots-ratio", "ev.times(m2, s2 / front)", "ev.times(m2, 1)",
      "s1 · (x @ m1) + s2 · (x @ m2) merges m2 scaled by s2 / s1: without it a LoRA merge that drops its scale verifies",
      "pytest:tests/translate/test_factored_dots.py -k near_miss",
      "pytest:tests/translate/test_factored_dots.py -k stated_equal"),
    M("factored-dots-any-left", "or f1[0] != f2[0] or", "or",
      "only products of one left factor add up to the product of the summed right factors",
      "pytest:tests/translate/test_factored_dots.py -k different_left"),
    M("factored-dots-lhs-layout", "        left = _transposed(left)\n", "",
      "a dot contracting its lhs's first dim multiplies by the lhs transposed",
      "pytest:tests/translate/test_factored_dots.py -k stated_equal"),
    # -- layered proofs --------------------------------------------------------------------------------
    M("split-into-passes", "reference_events, distributed_events, reference_outputs, device_outputs, targets, passes=True",
      "reference_events, distributed_events, reference_outputs, device_outputs, targets, passes=False",
      "layers that use each other both ways (a training step's backward pass) are split into passes",
      "pytest:tests/layers/test_layers.py::test_layers_that_depend_on_each_other_are_split_into_passes",
      "pytest:tests/prove/test_training_step_work.py::test_a_training_step_by_layers_proves_nothing_new_for_more_identical_layers"),
    M("autodiff-scope", "parts = [m.group(1) if (m := _AUTODIFF.match(p)) and m.group(1) else p for p in parts]",
      "parts = parts",
      "the reference's backward ops of a layer are named `transpose(jvp(layers_3))`: that layer's, in passes",
      "pytest:tests/layers/test_layers.py::test_a_scope_under_autodiff_is_the_scope_when_splitting_into_passes",
      "pytest:tests/prove/test_training_step_work.py::test_a_training_step_by_layers_proves_nothing_new_for_more_identical_layers"),
    M("pass-direction", "return u[0], -rank[u[1]] if u[0] % 2 else rank[u[1]]", "return u[0], rank[u[1]]",
      "the second pass runs the layers back: a backward op reading the next layer's gradient stays in its pass",
      "pytest:tests/layers/test_layers.py::test_layers_that_depend_on_each_other_are_split_into_passes",
      "pytest:tests/prove/test_training_step_work.py::test_a_training_step_by_layers_proves_nothing_new_for_more_identical_layers"),
    M("layer-form-partners", "form = canonical_form(roots + [t for g in groups for t in g], marked, groups)",
      "form = canonical_form(roots, marked, groups)",
      "a layer's proof may use the partners brought in: layers share one only when those are the same",
      "pytest:tests/prove/test_layered_groups.py::test_layers_share_a_proof_only_when_their_partners_are_the_same"),
    M("layer-facts-inside", "kept = {j for j in new if all(abstraction.stays_inside(t) for t in self.equal_terms[j])}",
      "kept = new",
      "a layer is first proved without the facts that reach into layers it does not read: identical layers share it",
      "pytest:tests/prove/test_residual_layers_share.py::test_a_deeper_residual_model_proves_no_layer_more"),
    M("layer-facts-all-when-needed", "if problem.narrowed and not _holds(result):",
      "if not problem.narrowed and not _holds(result):",
      "where a layer's own facts do not prove it, it is proved again with all the facts it reaches",
      "pytest:tests/prove/test_layered_groups.py::test_a_layer_is_proved_first_with_its_own_facts_and_again_with_all_where_those_do_not_suffice"),
    # -- the cache -----------------------------------------------------------------------------------
    M("fingerprint-source", "equivci.__version__,\n            h.hexdigest(),\n            sys.version,", "equivci.__version__,\n            sys.version,",
      "a changed verifier must not reuse old verdicts", CACHE + "test_an_edit_to_the_verifier_source_changes_the_fingerprint"),
    M("fingerprint-egglog", '"egglog",\n            _dist_version("egglog"),', '"egglog",',
      "another egglog may prove other things", CACHE + "test_each_dependency_version_changes_the_fingerprint"),
    # Localization (diagnose/): where the first finding points, not a verdict.
    M("numeric-unit-dims-indexed", "forms = [value] + [np.squeeze(value)] * (1 in value.shape)", "forms = [value]",
      "a reference value with a unit dim holds the data of the device's value without it",
      "pytest:tests/diagnose/test_numeric.py::test_a_value_with_unit_dims_added_or_dropped_matches"),
    M("numeric-unit-dims-queried", "return self._matches(a) or (1 in a.shape and self._matches(np.squeeze(a)))",
      "return self._matches(a)", "`x[:, None, :]` holds x's data: it matches x",
      "pytest:tests/diagnose/test_numeric.py::test_a_value_with_unit_dims_added_or_dropped_matches"),
    M("numeric-groups-merged", "forms.append(value.reshape((-1,) + value.shape[2:]))", "pass",
      "one group of a reference vmapped over groups is rows of its two leading dims merged",
      "pytest:tests/diagnose/test_numeric.py::test_one_group_of_a_reference_vmapped_over_groups_matches"),
    M("numeric-inputs-indexed", "index.add(params[k])", "pass",
      "an all-gathered shard of an input is a reference value",
      "pytest:tests/diagnose/test_numeric.py::test_the_frontier_passes_gathered_inputs_and_device_constants_and_stops_at_a_difference"),
    M("numeric-index-values-compared", "if inst.shape.dtype in INDEX_TYPES or not any(",
      "if not any(", "ids shifted into a shard have no counterpart the reference holds",
      "pytest:tests/diagnose/test_numeric.py::test_the_frontier_passes_gathered_inputs_and_device_constants_and_stops_at_a_difference"),
    M("numeric-constants-compared", "or not any(values.reads_input(t) for t in terms):",
      "or not any(True for t in terms):", "a device's position table has no counterpart the reference holds",
      "pytest:tests/diagnose/test_numeric.py::test_the_frontier_passes_gathered_inputs_and_device_constants_and_stops_at_a_difference"),
    M("numeric-from-the-proof-stop", "begin = next((k for k, e in enumerate(distributed_events) if e.inst is start), 0)",
      "begin = 0", "before the proof's stop every value is proved related to the reference",
      "pytest:tests/diagnose/test_numeric.py::test_the_frontier_passes_gathered_inputs_and_device_constants_and_stops_at_a_difference"),
    M("numeric-absorbed", "            absorbed |= reads\n", "            pass\n",
      "a difference a matching value is computed from was masked out or summed away",
      "pytest:tests/diagnose/test_numeric.py::test_a_difference_a_matching_value_is_computed_from_is_no_frontier"),
    M("numeric-undecided", "if differs is not None and _undecided(terms[differs], unknown):",
      "if False:", "a value that may be a window of a reference value numerics cannot evaluate is no evidence",
      "pytest:tests/diagnose/test_numeric.py::"
      "test_a_value_that_may_be_a_window_of_a_reference_value_numerics_cannot_evaluate_is_undecided"),
    M("numeric-leads-only-unexplained",
      "missing_rule = defect.unexplained and frontier is not None and frontier.start_matches",
      "missing_rule = frontier is not None and frontier.start_matches",
      "numerics cannot tell the right reference value from another: a defect the proof explains keeps the lead",
      "pytest:tests/capture/test_hlo_files.py::test_llama_tp2_wrong_k_start_is_a_mismatch_at_the_slice"),
    M("numeric-start-tracked", "reads |= {START} if inst is start else frozenset()", "reads |= frozenset()",
      "the proof's stop matches when a value computed from it does",
      "pytest:tests/diagnose/test_numeric.py::test_the_start_matches_when_a_value_computed_from_it_does"),
    M("numeric-uniform-no-evidence", "if differs is None and all(a.size > 1 and (a == a.flat[0]).all() for a in arrays):",
      "if False:", "a value of equal elements matches any tile of equal elements: no evidence it is right",
      "pytest:tests/diagnose/test_numeric.py::test_a_value_of_equal_elements_that_matches_is_no_evidence"),
    M("numeric-apart-by-rounding", "if float(np.max(np.abs(x - y), initial=0.0)) > APART * scale:",
      "if float(np.max(np.abs(x - y), initial=0.0)) > 0.0:",
      "a what-if whose outputs differ from their targets by rounding only is not ruled out before its proof",
      "pytest:tests/diagnose/test_numeric.py::test_far_apart_rules_out_a_what_if_only_on_a_clear_difference"),
    M("numeric-apart-index-inputs", "if any(t.dtype not in _DRAWN for t in leaves.values()):\n        return False",
      "if any(t.dtype not in _DRAWN for t in leaves.values()):\n        return True",
      "an index input's valid range is unknown to the draw: no evidence, the what-if goes to the proof",
      "pytest:tests/diagnose/test_numeric.py::test_far_apart_rules_out_a_what_if_only_on_a_clear_difference"),
    M("numeric-replicated-partial", "        if all(np.array_equal(arrays[d], arrays[dev]) for d in group):\n            continue\n",
      "", "a value replicated over an axis is no partial sum there (a pmean where a psum was due)",
      "pytest:tests/diagnose/test_numeric.py::test_a_value_replicated_over_an_axis_is_no_partial_sum_there"),
    M("numeric-call-parameter-unlinked",
      '            reads |= frozenset().union(*(upstream.get(made_by.get(a, ""), frozenset()) for a in args))',
      "            pass", "a called body's parameter holds the call's operand: what that is computed from, it is",
      "pytest:tests/diagnose/test_numeric.py::"
      "test_a_difference_passed_into_a_called_body_is_absorbed_by_what_the_body_computes"),
    M("numeric-axis-sets-left-out", "    groups_by_axis = with_axis_sets(groups_by_axis)\n", "",
      "a partial sum may await one all-reduce over several mesh axes at once",
      "pytest:tests/diagnose/test_numeric.py::test_the_frontier_passes_a_partial_sum_over_two_axes"),
    M("numeric-partial-completed-ignored", "                completed.update(reads)", "                pass",
      "a partial sum a value matching in full is computed from was all-reduced",
      "pytest:tests/diagnose/test_numeric.py::test_a_partial_sum_no_all_reduce_follows_is_reported_with_its_use"),
    M("numeric-partial-origin-not-followed",
      "            found = next((e for e in before if e is not None and partial_over(e, axis)), None)",
      "            found = None", "the psum belongs where the partial sum is made, before ops that keep it one",
      "pytest:tests/diagnose/test_unreduced_partial.py::test_the_partial_sum_without_its_all_reduce_leads"),
    M("unreduced-partial-no-lead",
      "    if frontier is not None and numeric is not None and frontier.partial is not None:",
      "    if False:", "a partial sum used as the full value leads over a value the proof could not relate",
      "pytest:tests/diagnose/test_unreduced_partial.py::test_the_partial_sum_without_its_all_reduce_leads"),
    M("summed-inside-no-lead", "        if frontier.reduced_after is not None and use.inst.opcode in ADDITIVE:",
      "        if False:", "a value added to a partial sum inside its all-reduce is counted once per device: the add leads",
      "pytest:tests/diagnose/test_summed_inside.py::test_the_add_inside_the_all_reduce_leads"),
    M("summed-inside-any-later-op",
      'if e.inst.opcode == "all-reduce" and m in reads and _sums(values, e, use, groups_by_axis[axis])',
      "if m in reads", "only an all-reduce of the use over the partial sum's axis shows the psum is there",
      "pytest:tests/diagnose/test_summed_inside.py::"
      "test_near_miss_an_add_no_all_reduce_follows_leaves_the_partial_sum_first"),
    M("numeric-apart-meets-stop", "        and not any(lead in reads and START in reads for reads in upstream.values())\n",
      "", "a difference that meets the proof's stop later (rows its test selects) may be the stop's doing",
      "pytest:tests/diagnose/test_numeric.py::test_a_difference_not_computed_from_the_start_is_apart"),
    M("branch-flag-not-read",
      "            choices = [picked.pop((c.file, c.line, c.parameter), c) for c in choices] + list(picked.values())",
      "            pass", "a statement under `if flag:` runs because of the flag: the flag is a choice the op depends on",
      "pytest:tests/diagnose/test_branch_flag.py::test_the_branch_the_flag_picks_leads"),
    M("branch-flag-call-leads",
      "    if choice.branch is not None and not (_callable(choice.text) and not unchanged):", "    if False:",
      "a flag that picks an `if` branch is written in that branch's statement, not at the call passing it",
      "pytest:tests/diagnose/test_branch_flag.py::test_the_branch_the_flag_picks_leads"),
    M("branch-over-passed-function",
      "    if choice.branch is not None and not (_callable(choice.text) and not unchanged):",
      "    if choice.branch is not None:", "a function passed by name is written in its own body, whatever branch it picks",
      "pytest:tests/diagnose/test_branch_flag.py::test_a_function_passed_for_the_branch_leads_in_its_own_body"),
    M("nearest-line-dropped", "    near = nearest_located(inst, events, captured.repo_root) if path is None else None",
      "    near = None", "a finding on an op XLA made carries the nearest op's line, not none",
      "pytest:tests/diagnose/test_nearest_line.py::test_a_finding_on_an_op_without_a_line_carries_the_nearest_and_says_so"),
    M("nearest-users-not-followed", "        reached.add(event.inst.name)", "        pass",
      "a user without a line hands the value on: the first user with one is past it",
      "pytest:tests/diagnose/test_nearest_line.py::test_the_first_user_with_a_line_past_users_without_one"),
    M("choice-table-entry-not-static", "        return _static(file, arg.value) and _static(file, arg.slice)",
      "        return False", "an entry of a module-level table at a fixed key is fixed when the program is written",
      "pytest:tests/diagnose/test_caller_choice_source.py::test_an_entry_of_a_module_table_at_a_fixed_key_is_a_choice"),
    M("oracle-rounding-either-side", "either = max(b, dst_eps / 2) if fresh else b", "either = b",
      "a rounding right after a constant scale may sit before it in a correct program: every element may flip",
      "pytest:tests/capture/test_oracle_precision.py::test_a_rounding_right_after_inexact_arithmetic_may_move_every_element"),
    M("numeric-draw-ranges", "(ranges or {}).get(i, (0, high))", "(0, high)",
      "the integer inputs are drawn where the oracle draws them",
      "pytest:tests/diagnose/test_numeric.py::test_the_draw_keeps_integer_inputs_in_the_ranges_the_oracle_draws_in"),
    M("reduction-missing-axis", "or scaled_reduction_after(event) or short_reduction_after(event)",
      "or scaled_reduction_after(event)",
      "a share of a sum over an axis its all-reduce leaves out is made there, not where the proof first stops",
      "pytest:tests/diagnose/test_reduction_axes.py::test_gradients_averaged_over_one_axis_of_two_blame_the_mean"),
    M("reduction-wrong-axis", "if outcome == \"unrelated\" and before != \"unrelated\" and axis is not None and axis not in reduced:",
      "if False:", "an all-reduce over another axis than the one its operand is a share over adds different parts",
      "pytest:tests/diagnose/test_reduction_axes.py::test_a_partial_sum_reduced_over_another_axis_blames_the_reduction"),
    M("reduction-affine-use", 'affine = event.inst.opcode in ("add", "subtract") and len(partials) < len(operand_events)',
      "affine = False", "a whole value added to each share of an all-reduce that leaves out the share's axis: that reduction is unfinished",
      "pytest:tests/diagnose/test_reduction_axes.py::test_a_projection_summed_over_one_axis_of_two_blames_the_sum"),
    M("reduction-axes-of-groups", "if any(len(g & set(line)) > 1 for g in groups for line in lines)",
      "if any(len(g & set(line)) >= 1 for g in groups for line in lines)",
      "an all-reduce sums over an axis only where one of its groups holds two devices of that axis",
      "pytest:tests/diagnose/test_reduction_axes.py::"
      "test_the_axes_an_all_reduce_sums_over_are_those_whose_devices_share_one_of_its_groups"),
    M("ring-closed", "out.append(sorted(pairs + _closing_pairs(step)))", "pass",
      "a device no pair sends to receives zeros: a ring that lacks its wrap-around pair is one candidate",
      "pytest:tests/diagnose/test_ring_pairs.py::test_a_chain_is_offered_closed_into_a_ring"),
    M("pairs-what-if-first", "rerouted = rerouting(events, proof, evaluator)", "rerouted = None",
      "pairs that, sent another way, make every output the reference's lead (a repair proved), asked "
      "before the walk's hypotheses use up the e-graph's room",
      "pytest:tests/diagnose/test_localize.py::test_the_pairs_what_if_comes_before_the_walks_hypotheses"),
    M("factory-call-site", "return unique if len(unique) == 1 else []", "return []",
      "a closure made by a factory got its arguments at the factory's call, which no op's stack holds",
      "pytest:tests/diagnose/test_ring_pairs.py::test_a_ring_without_its_wrap_pair_blames_the_pairs[stack_chain-chain]"),
    M("missing-work-from-input", "self.name_inputs(e, tracer.value(e, 0))", "pass",
      "the work the reference applies to an input it reads directly is missing work too",
      "pytest:tests/diagnose/test_missing_input_work.py::"
      "test_a_norm_skipped_on_an_input_blames_the_projection_and_cites_the_reference_norm[block_sp_no_norm-sp_projection]"),
    M("missing-work-input-operand", "else self.input_read(event, k, dev)", "else None",
      "an operand that is the input itself starts the chain of missing work",
      "pytest:tests/diagnose/test_missing_input_work.py::"
      "test_a_norm_skipped_on_an_input_blames_the_projection_and_cites_the_reference_norm[block_tp_no_norm-tp_projection]"),
    M("missing-work-same-function", "score = score or shared_frames(frames, user_frames(consumer.inst), by_function=True)",
      "score = score", "a norm written as its own statement before the consumer is cited at that statement",
      "pytest:tests/diagnose/test_missing_input_work.py::"
      "test_a_norm_skipped_on_an_input_blames_the_projection_and_cites_the_reference_norm[block_sp_no_norm-sp_projection]"),
    M("helper-body-leads", "helper = made_in(choice.text, inst, events, captured.repo_root)",
      "helper = None", "what a function passed by name computes for the op is cited in its body",
      "pytest:tests/diagnose/test_sibling_departure.py::test_the_departing_statement_leads_and_the_call_is_a_tied_note[raw-raw-raw-call-shared]"),
    M("partial-in-helper-site", "for f in _reached(self.entry)]", "for f in _reached(self.entry)[:1]]",
      "a shard_map body bound by a partial in a helper the entrypoint calls takes its choice from that partial",
      "pytest:tests/diagnose/test_partial_in_helper.py::test_the_choice_bound_by_a_partial_in_a_helper_leads"),
    M("sibling-departure-leads", "departs = departure(choice.file, choice.text, choice.others)", "departs = None",
      "a function passed by name leads where it departs from the one another call passes, not where its op is",
      "pytest:tests/diagnose/test_sibling_departure.py::test_the_departing_statement_leads_and_the_call_is_a_tied_note"),
    M("sibling-missing-work-lands-after", "return mine[min(i1, len(mine) - 1)][1]", "return mine[max(i1 - 1, 0)][1]",
      "work a helper lacks lands on the statement that should carry it, not the one before",
      "pytest:tests/diagnose/test_sibling_departure.py::test_work_left_out_lands_on_the_statement_that_should_carry_it"),
    M("sibling-unrelated-bodies", "if shared == 0 and max(len(mine), len(theirs)) > 1:", "if False:",
      "two helpers that share no statement say nothing about where one departs",
      "pytest:tests/diagnose/test_sibling_departure.py::test_the_closest_sibling_is_compared_and_unrelated_bodies_say_nothing"),
    M("identity-function-call-leads",
      "unchanged = choice.text.isidentifier() and returns_its_argument(choice.file, choice.text)",
      "unchanged = False", "a passed function that returns its argument unchanged does no work: its call leads",
      "pytest:tests/diagnose/test_sibling_departure.py::"
      "test_a_passed_function_that_returns_its_argument_unchanged_leads_at_the_call"),
    M("identity-function-one-parameter", "        len(names) == 1\n", "        len(names) >= 1\n",
      "a function that leaves a parameter unused does work in its body (it should read it): no identity",
      "pytest:tests/diagnose/test_sibling_departure.py::"
      "test_only_a_function_that_returns_its_one_parameter_unchanged_does_no_work"),
    M("starred-binds-last-parameters", "bound.update(zip(filled[len(filled) - len(trailing) :], trailing))",
      "bound.update(zip(filled, trailing))",
      "the arguments after a starred one bind the last parameters, not the first",
      "pytest:tests/diagnose/test_caller_choice_source.py::test_positional_arguments_after_a_starred_one"),
    M("starred-needs-exact-binding", "if func.args.defaults or func.args.vararg is not None:",
      "if func.args.vararg is not None:",
      "with a default the starred argument may fill a parameter too: no binding is known",
      "pytest:tests/diagnose/test_caller_choice_source.py::"
      "test_an_argument_after_a_starred_one_binds_the_last_parameter_where_the_call_must_bind_all"),
    M("starred-literal-choice", "placed = {} if partial else positional_arguments(func, node)", "placed = {}",
      "a literal after a starred argument is compared with what another call passes there",
      "pytest:tests/diagnose/test_caller_choice_source.py::"
      "test_a_literal_after_a_starred_argument_is_a_choice_against_another_call"),
    M("numeric-apart-from-stop", "and START not in differing_reads[lead]", "and True",
      "a difference computed from the proof's stop is not apart from it",
      "pytest:tests/diagnose/test_numeric.py::test_a_difference_not_computed_from_the_start_is_apart"),
    M("numeric-apart-leads", "and (missing_rule or frontier.apart)", "and missing_rule",
      "a difference numerics shows apart from the proof's stop leads the stop",
      "pytest:tests/diagnose/test_apart_frontier.py::test_a_difference_apart_from_the_stop_leads"),
    M("numeric-broadcast-repeats", "if differs is not None and _repeats(inst, terms, repeated, _matches):",
      "if False:", "a broadcast of values that match repeats right elements: no frontier, its use is compared",
      "pytest:tests/diagnose/test_numeric.py::test_a_broadcast_of_a_matching_value_is_no_frontier_the_op_that_uses_it_is"),
    M("numeric-repeats-relayout", "        return inst.opcode in RELAYOUTS\n", "        return False\n",
      "a broadcast of a unit-dim reshape of a matching value repeats right elements too",
      "pytest:tests/diagnose/test_numeric.py::test_a_broadcast_of_a_matching_value_is_no_frontier_the_op_that_uses_it_is"),
    M("sibling-one-return", "return body[0].lineno if len(body) == 1 and isinstance(body[0], ast.Return) else None",
      "return body[0].lineno if body else None", "only a body of one return is written on one line",
      "pytest:tests/diagnose/test_sibling_departure.py::test_a_function_of_one_return_is_written_on_that_line"),
    M("passed-one-line-leads", "elif (only := one_statement(choice.file, choice.text)) is not None:",
      "elif (only := None) is not None:", "a passed function of one return leads on that line, not at its call",
      "pytest:tests/diagnose/test_passed_one_liner.py::test_the_one_line_of_the_passed_function_leads"),
    M("wrapped-call-binds", "    return callee(call) == name or (\n", "    return callee(call) == name or False and (\n",
      "shard_map(f, ...)(args) calls f with args: the choice is searched through it",
      "pytest:tests/diagnose/test_caller_choice_source.py::test_a_choice_is_found_through_a_wrapped_call_and_a_name_rebound_from_itself"),
    M("search-per-binding", "if (name, binding) in seen:", "if any(n == name for n, _ in seen):",
      "`w = w[0]` reads the parameter w: a name is followed once per binding",
      "pytest:tests/diagnose/test_caller_choice_source.py::test_a_choice_is_found_through_a_wrapped_call_and_a_name_rebound_from_itself"),
    M("loop-target-binds", "            return [node.iter]\n", "            return []\n",
      "a loop's target is bound by its iterable, which may read a choice",
      "pytest:tests/diagnose/test_caller_choice_source.py::test_a_loop_target_is_bound_by_the_iterable"),
    M("shared-call-choice", "        choice is None\n        and shared_call(inst, captured.repo_root, reference_lines) is not None",
      "        False\n        and shared_call(inst, captured.repo_root, reference_lines) is not None",
      "an op of shared code depends on a choice the call into it reads (a schedule's tick count)",
      "pytest:tests/diagnose/test_schedule_choice.py::test_the_tick_count_the_schedule_is_given_leads"),
    M("work-held-leads", "holder = self.holder(wanted, event, dev) if wanted is not None else None", "holder = None",
      "a worked value the distributed program holds but the op does not read: the op's line leads",
      "pytest:tests/diagnose/test_work_held_elsewhere.py::test_the_op_that_reads_the_value_from_before_the_work_leads"),
    # -- the value a shared helper is handed (diagnose/handed.py) -----------------------------------------
    M("handed-origin-leads", "origin = handed_origin(inst, events, captured.repo_root, reference_lines)",
      "origin = None", "a shared op that differs leads where the distributed program makes the value it is handed",
      "pytest:tests/diagnose/test_handed_value.py::test_a_mask_made_before_the_shard_map_leads"),
    M("handed-callee-first", "inner = lines - called_from", "inner = lines",
      "an op made inside a call from another frontier line is more specific than the line that calls it",
      "pytest:tests/diagnose/test_handed_value.py::test_an_op_inside_a_call_from_the_other_line_is_more_specific"),
    M("handed-one-line", "if len(inner) != 1:\n        return None\n    (line,) = inner",
      "if not inner:\n        return None\n    line = min(inner)",
      "values made on two distributed lines name neither: the call stays the suspect",
      "pytest:tests/diagnose/test_handed_value.py::test_near_miss_two_lines_make_what_is_handed"),
    M("handed-input-passed-on", "            else:\n                made.append(operand)",
      "            else:\n                made.append(operand)\n            if operand.inst.opcode == \"copy\":\n"
      "                made.append(operand)",
      "an input handed on as it is names no line of the distributed program",
      "pytest:tests/diagnose/test_handed_value.py::test_near_miss_an_input_handed_on_as_it_is"),
    M("handed-walk-bound", "    if queue:\n        return None  # the walk stopped", "    if False:\n        return None  # the walk stopped",
      "a walk cut at its bound names nothing (what it found is not all the handed value comes from)",
      "pytest:tests/diagnose/test_handed_value.py::test_a_walk_past_its_bound_names_nothing"),
    # -- what a callback computes is written where it is passed; a swapped operand at its reader --
    M("callback-work-not-taken", "    return lead, (defect.frontier if defect.work is not None else None)",
      "    return lead, None",
      "work missing after a value made right belongs where the op takes it: a callable passed there is a choice",
      "pytest:tests/diagnose/test_callback_call_site.py::test_a_residual_left_out_by_an_identity_lambda_leads_at_its_call"),
    M("callback-written-ignored",
      "        choice = written_callback(inst, events, captured.repo_root, foreign, reference_runs)",
      "        choice = None", "a lambda written at a call, around a helper another call's lambda calls too, is that call's choice",
      "pytest:tests/diagnose/test_callback_call_site.py::test_a_lambda_around_a_shared_helper_leads_at_its_call"),
    M("swapped-operand-at-producer", "                reader = path[-2] if len(path) > 1 else event",
      "                reader = path[-1]", "an operand the reference reads in another place is made right: its reader leads",
      "pytest:tests/diagnose/test_callback_call_site.py::test_swapped_operands_lead_at_the_op_that_reads_them"),
    # -- a value made right in shared code, received by the distributed program (diagnose/findings.py) --
    M("received-value-leads", "    if kept is None:\n        return found\n    lead, rest", "    if True:\n        return found\n    lead, rest",
      "a shared op whose value is the reference's leads where the distributed program receives it, not at what it was handed",
      "pytest:tests/diagnose/test_received_value.py::test_the_line_that_receives_or_sets_the_value_leads[no-residual]"),
    M("received-kept-producer", "produced = found.at_producer and at_producer is not None",
      "produced = False",
      "work missing after a value the reference's producer made marks that value as kept right",
      "pytest:tests/diagnose/test_received_value.py::test_the_line_that_receives_or_sets_the_value_leads[no-residual]"),
    M("received-taking-callable-only", "if found is not None and _callable(found.text):", "if found is not None:",
      "only a callable the caller passes stands where a missing all-reduce belongs; a flag's branch is written in the helper",
      "pytest:tests/diagnose/test_unreduced_partial.py::test_the_partial_sum_without_its_all_reduce_leads"),
    M("axes-written-leads", "written = literal_written(inst, events, captured.repo_root, defect.axes, entry)",
      "written = None",
      "an all-reduce whose axes are the defect leads where its axis literal is written",
      "pytest:tests/diagnose/test_received_value.py::test_the_line_that_receives_or_sets_the_value_leads[wrong-axis]"),
    M("reduce-max-nonlinear", 'or reducer in _NONLINEAR | {"multiply"}', 'or reducer in {"multiply"}',
      "a reduce keeping the maximum of its lanes is not linear: a partial sum it takes lacks its psum where it is made",
      "pytest:tests/diagnose/test_unreduced_max.py::test_a_max_of_partial_logits_leads_where_the_partial_sum_is_made"),
    M("instance-call-site", "calls, skip = _instance_calls(found[0], cfile), 1", "calls, skip = [], 1",
      "an instance runs its `__call__` when called itself: its call passes the parameters",
      "pytest:tests/diagnose/test_received_value.py::test_the_line_that_receives_or_sets_the_value_leads[wrong-axis]"),
    # -- a sum divided by the wrong count (diagnose/divisor.py) ---------------------------------------
    M("divisor-division-leads", "divided = constant_division(event, events, constants)", "divided = None",
      "a sum k x the reference value divided by a constant other than k leads at the division (or its divisor's call)",
      "pytest:tests/diagnose/test_wrong_divisor.py::test_the_division_by_the_wrong_count_is_the_finding",
      "pytest:tests/diagnose/test_wrong_divisor.py::test_the_call_passing_the_wrong_count_leads_for_an_autodiff_sum"),
    # -- the gradient's first use outside autodiff (diagnose/gradients.py) --------------------------
    M("gradient-use-leads", "use = first_use_after_autodiff(event, events) if made_by_autodiff(event.inst) else None",
      "use = None",
      "an autodiff value that stays apart leads where the program takes the gradient over, not at the forward line",
      "pytest:tests/diagnose/test_gradient_use.py::test_the_helper_that_leaves_the_gradient_unreduced_is_the_finding",
      "pytest:tests/diagnose/test_gradient_use.py::test_the_update_that_takes_the_gradient_as_it_is_is_the_finding"),
    M("gradient-use-outside", 'outside = inst.opcode not in TRIVIAL_OPS and not made_by_autodiff(inst) and "jvp(" not in inst.op_name',
      "outside = inst.opcode not in TRIVIAL_OPS",
      "the gradient's use is the first op autodiff did not make: another transpose op is still the gradient's computation",
      "pytest:tests/diagnose/test_gradient_use.py::test_the_update_that_takes_the_gradient_as_it_is_is_the_finding"),
    # -- a rounding the reference does not make (diagnose/precision.py) ------------------------------
    M("rounding-unnamed", "    return (narrow, wide) if wide in WIDER.get(narrow, ()) else None", "    return None",
      "a float made narrower where the reference keeps it wide is named as a changed dtype, not as a missing rule",
      "pytest:tests/diagnose/test_rounded_precision.py::test_a_rounding_the_reference_lacks_is_the_difference_it_makes"),
    M("rounding-widening", "    return (narrow, wide) if wide in WIDER.get(narrow, ()) else None",
      "    return (narrow, wide) if narrow != wide else None",
      "a convert to a wider float is exact: no rounding to name",
      "pytest:tests/diagnose/test_rounded_precision.py::test_only_a_float_made_narrower_is_a_rounding"),
    # -- class ids as windows of an iota too large to fold (translate/constants.py) -------------------
    M("iota-window-past-end", "if not first.is_integer() or not 0 <= first <= size - n:",
      "if not first.is_integer() or not 0 <= first:",
      "a window of iota(N) ends inside it: ids past N are no ids of the reference",
      "pytest:tests/translate/test_iota_windows.py -k near_miss_ids_are_no_window"),
    M("iota-window-unchecked", "if np.array_equal(np.broadcast_to(formula, squeezed.shape), squeezed):", "if True:",
      "a constant is the iota's window only where every element is its id",
      "pytest:tests/translate/test_iota_windows.py -k near_miss_ids",
      "pytest:tests/translate/test_iota_windows.py -k near_misses_over"),
    M("iota-window-dtype", "if source.dtype != dtype or dim not in own", "if dim not in own",
      "an iota's ids are of its dtype: float ids are no window of an integer iota",
      "pytest:tests/translate/test_iota_windows.py -k near_miss_ids_are_no_window"),
    M("iota-window-unregistered", "    ev.constants.add_iota(term)\n", "",
      "the reference's unfolded iota is where a device's folded class ids are found",
      "pytest:tests/translate/test_iota_windows.py::test_an_8b_wide_cross_entropy_step_verifies"),
    # -- reshape specs narrowed only to the specs that occur (terms/load.py) -------------------------
    M("reshape-narrow-reversed", "if other_size < size:", "if other_size > size:",
      "a narrower split is the one of smaller size: the pair is stated from the wider spec",
      "pytest:tests/translate/test_head_windows.py"),
    # -- copies: size-1 broadcasts, tiles, dots of copies (translate/shapes.py, tiles.py, reductions.py)
    M("unit-bcast-kept", "            return ev.reshape_term(operand, shape)\n", "            pass\n",
      "a broadcast that only inserts size-1 dims is the reshape of its operand",
      "pytest:tests/translate/test_tiles.py::test_a_broadcast_inserting_only_size_one_dims_is_a_reshape"),
    M("tile-any-order", "return [] if np.array_equal(labels, np.arange(size).reshape(labels.shape)) else None",
      "return []",
      "copies are a tile only when each reads y's elements in row-major order: a repeat interleaves them",
      "pytest:tests/translate/test_tiles.py::test_tile_dims_reads_the_copies_on_labels",
      "pytest:tests/translate/test_tiles.py::test_near_miss_copies_interleaved_otherwise_are_mismatches"),
    M("dot-of-copies-any-dim", "if d not in spec.rhs_batch + spec.rhs_contract]", "if d not in spec.rhs_batch]",
      "a dot commutes with copies only along a free dim: over a contracted or batch dim it sums or pairs them",
      "pytest:tests/translate/test_tiles.py::test_a_dot_summing_or_batching_over_copies_is_not_split"),
    M("dot-of-copies-first-dim", "o = first + free.index(dim)", "o = first",
      "the dot's copies lie along the output dim of the operand's copied free dim",
      "pytest:tests/translate/test_tiles.py::test_a_dot_summing_or_batching_over_copies_is_not_split",
      "pytest:tests/translate/test_tiles.py::test_a_dot_of_copies_is_stated_as_the_copies_of_the_dot_and_computes_what_xla_computes"),
    M("gathered-product-one-index",
      "(f.idx, f.dims, f.dense.shape) != (known[0].idx, known[0].dims, known[0].dense.shape) for f in known",
      "(f.dims, f.dense.shape) != (known[0].dims, known[0].dense.shape) for f in known",
      "values gathered at two indices combined elementwise are no gather at one of them",
      "model:gathered-moe-dp-other-choice",
      "pytest:tests/translate/test_gathered_dots.py -k two_indices"),
    M("gathered-dot-one-index", "if not known or (len(known) == 2 and known[0].idx is not known[1].idx):",
      "if not known:",
      "a dot of operands gathered at two indices is no gather of the dense dot at either",
      "pytest:tests/translate/test_gathered_dots.py -k two_indices"),
    M("unrolled-every-choice-once", "if sorted(c.j for c in found) != list(range(j0, j0 + k)):", "if len(found) != k:",
      "the dot over the choices adds each choice once: a choice twice and another left out is another sum",
      "pytest:tests/translate/test_gathered_dots.py -k every_choice_once"),
    M("unrolled-choice-at-its-index",
      "first.idx_dim, first.start - first.j)\n    if any((c.w, c.w_dim, c.dense, c.dims, c.idx, c.idx_dim, c.start - c.j) != same",
      "first.idx_dim)\n    if any((c.w, c.w_dim, c.dense, c.dims, c.idx, c.idx_dim) != same",
      "a choice's weight goes with its own index window, at one offset for all of them",
      "pytest:tests/translate/test_gathered_dots.py -k every_choice_once"),
    M("unrolled-run-index-window", "    at = j0 + first.start - first.j\n", "    at = first.start - first.j\n",
      "a run of choices from j0 reads the index window at j0 plus the offset, not from the offset alone",
      "pytest:tests/translate/test_gathered_dots.py -k run_of_choices"),
    M("weighted-pick-one-hot-first", "[ev.binary(\"multiply\", one_hot, weights)]", "[ev.binary(\"multiply\", one_hot, one_hot)]",
      "the one-hot first is the same product of the one-hot and the weights, not the one-hot squared",
      "pytest:tests/translate/test_gathered_dots.py -k dense_dot_gathered"),
    M("copied-window-unchecked", "        if np.array_equal(laid.reshape(window.shape), window):\n",
      "        if laid.size == window.size:\n",
      "a window of copies is copies of a window only where its groups are cut alike: [1:5) of a 4-fold repeat is not",
      "pytest:tests/translate/test_repeat_windows.py::test_a_window_of_a_repeat_is_the_repeat_of_a_window_when_its_groups_are_cut_alike",
      "pytest:tests/translate/test_repeat_windows.py::test_near_miss_tiled_heads_or_a_window_across_groups_are_mismatches"),
    M("batch-copies-unchecked", "        if not tiles.constant_along(copies, t.shape, j, ev.budgets.layout_labels):\n",
      "        if False:\n",
      "only an operand that holds the same slice at every index of the batch dim is one copy against all of them",
      "pytest:tests/translate/test_repeat_windows.py::test_a_dot_of_copies_along_a_free_or_contracted_dim_or_of_a_varying_operand_is_not_rewritten"),
    M("summed-product-narrow", 'WIDE = {"f32", "f64"}', 'WIDE = {"f32", "f64", "f16"}',
      "a sum of f16 products is no f16 dot (that is its f32 dot rounded once)",
      "pytest:tests/translate/test_summed_products.py::test_a_sum_over_a_dim_one_operand_is_broadcast_along_or_in_f16_stays_a_sum"),
    # -- a dot of a squeezed op under a constant factor (translate/relayouts.py) ---------------------
    M("squeezed-dot-factor-dropped", "    return ev.scale_of(t)\n", "    return Fraction(1), ev.scale_of(t)[1]\n",
      "the relaid dot keeps its operand's constant factor: without it the dot is stated equal to the "
      "written one, f times larger",
      "pytest:tests/translate/test_squeezes.py::test_a_dot_of_a_scaled_op_on_a_row_is_the_scaled_squeeze_of_the_dot"),
    M("squeezed-dot-factor-not-followed", "    return ev.scale_of(t)\n", "    return Fraction(1), t\n",
      "a constant factor in front of a squeezed operand is pulled out of the dot, and the relayout follows "
      "the squeeze under it",
      "pytest:tests/translate/test_squeezes.py::test_a_dot_of_a_scaled_op_on_a_row_is_the_scaled_squeeze_of_the_dot",
      "pytest:tests/translate/test_microbatch_mlps.py::test_microbatches_through_a_tp_gelu_mlp_verify"),
    # -- dots and products of squeezed values (translate/squeezes.py: one expert per rank, `w1[0]`) -------
    M("squeezed-product-any-op", 'if term.op != "binary" or term.attrs[0] != "multiply" or term.dtype not in FLOATS:',
      'if term.op != "binary" or term.dtype not in FLOATS:',
      "only a product is a dot over a size-1 pair: a sum or a quotient of the same squeezed values is none",
      "pytest:tests/translate/test_squeezed_dots.py::test_no_dot_is_stated_for_a_sum_or_a_quotient"),
    M("squeezed-product-transpose-forward", "tuple(order.index(o) for o in range(len(order)))", "tuple(order)",
      "the dot puts the broadcast operand's dims first; the transpose that restores the product's layout is "
      "the inverse of that order",
      "pytest:tests/translate/test_squeezed_dots.py::test_the_stated_dots_hold_on_one_device"),
    # -- attention on values with an inserted size-1 dim: dot_product_attention's [B, N, T, 1, S]
    # (translate/relayouts.py, reciprocals.py, reductions.py, elementwise.py) ----------------------------
    M("unit-dot-relayout-unfollowed", "    if inserted is not None:\n        left = [j for j",
      "    if False:\n        left = [j for j",
      "a dot of an operand with size-1 free dims inserted is the reshape of the dot without them",
      "pytest:tests/translate/test_attention_layouts.py::test_a_dot_of_an_operand_with_a_unit_dim_inserted_is_the_reshape_of_the_dot"),
    M("unit-quotient-inside", 'inner = base.args[0] if base.op == "reshape" else base', "inner = base",
      "the quotient of a reshaped value is the reshape of the quotient, as the reference divides its scores",
      "pytest:tests/translate/test_attention_layouts.py::test_attention_with_a_unit_group_dim_verifies[dpa]"),
    M("unit-reduction-quotient-unread", "    x = ev.quotients.get(x, x)\n", "",
      "a reduction of a scaled reshape is the reshape of the reduction of the quotient the reference reduces",
      "pytest:tests/translate/test_attention_layouts.py::test_attention_with_a_unit_group_dim_verifies[dpa]"),
    M("unit-viewed-bcast-off", 'elif op == "reshape" and base.op == "bcast" and (viewed',
      'elif False and (viewed',
      "a broadcast beside a reshape that inserts size-1 dims is laid out without them: a row statistic "
      "broadcast over scores with a unit dim",
      "pytest:tests/translate/test_attention_layouts.py::test_an_op_on_a_unit_reshape_and_a_broadcast_of_the_same_layout_is_the_reshape_of_the_op"),
    M("unit-viewed-squeezes-too", "    if inserted_unit_dims(dims, shape) is None:\n", "    if False:\n",
      "only reshapes that insert size-1 dims move outside an op beside a broadcast: a row squeezed out of "
      "a batch keeps its op as written (squeezes.py)",
      "pytest:tests/translate/test_attention_layouts.py::test_a_row_squeezed_out_of_a_batch_keeps_its_op_as_written"),
    M("unit-select-off", "if (outside := unit_reshaped_select(ev, args, shape)) is not None:", "if False:",
      "a select on branches with size-1 dims inserted is the reshape of the select on the branches without them",
      "pytest:tests/translate/test_attention_layouts.py::test_a_mask_on_scores_with_a_unit_dim_is_the_reshape_of_the_reference_mask",
      "pytest:tests/translate/test_attention_layouts.py::test_attention_with_a_unit_group_dim_verifies[dpa-causal]"),
    # -- a read window with size-1 dims as the broadcast of its squeeze (terms/ir.py, terms/load.py) --------
    M("unit-bcast-not-stated", "                self._unit_bcast(a, handle)\n", "                pass\n",
      "a stage's [1, f] slab of a stacked bias, added to a one-row microbatch, is the row of the broadcast "
      "the reference adds to every row: without the form the row's window cannot lift past it",
      "pytest:tests/translate/test_unit_slabs.py::test_one_row_microbatches_through_stacked_slabs_verify"),
    # -- the stated equalities the outputs can use, first (prove/saturate.py) ---------------------------
    M("needed-groups-skipped", "    needed = needed_groups(groups, roots)\n", "    needed = groups\n",
      "the facts about values no output is made of (a GPipe schedule's warm-up ticks on zeros) are left out "
      "of a first saturation: with them the e-graph outgrew its budget",
      "pytest:tests/prove/test_needed_groups.py::test_an_unproved_search_goes_on_with_the_facts_left_out_in_its_own_egraph",
      "pytest:tests/translate/test_microbatch_mlps.py::test_a_gpipe_schedule_of_tp_gelu_stages_verifies"),
    M("needed-groups-unchained", "                stack.extend(groups[k])\n", "                pass\n",
      "a group kept brings its members' own groups and arguments in: facts reach the outputs through others",
      "pytest:tests/prove/test_needed_groups.py"),
    M("needed-groups-rest-dropped",
      "    add_terms(proof, [], [group for group in groups if id(group) not in kept])\n", "    pass\n",
      "unless the first search proves every output, the facts it left out join its e-graph (the localization "
      "reads every value's relation there)",
      "pytest:tests/prove/test_needed_groups.py::test_an_unproved_search_goes_on_with_the_facts_left_out_in_its_own_egraph",
      "pytest:tests/prove/test_needed_groups.py::test_a_settled_first_search_grows_into_the_search_of_every_group"),
    # -- a test against one number as a column of the one-hot (translate/one_hot_columns.py) ------------
    M("one-hot-columns-any-table", "    if holds_positions(ev, b, new[0]):\n", "    if True:\n",
      "only a compare against each element's position along the new dim is a one-hot whose column c is x == c",
      "pytest:tests/translate/test_one_hot_columns.py::test_no_column_of_a_compare_against_other_numbers"),
    M("one-hot-columns-any-test", '    if direction != "EQ" or ev.folded(a) is not None:\n        return []\n',
      "    if ev.folded(a) is not None:\n        return []\n",
      "x != c or x <= c is no column of the one-hot",
      "pytest:tests/translate/test_one_hot_columns.py::test_no_column_for_another_test"),
    M("one-hot-columns-not-stated", "        ev.equal_terms.append([term, *found])\n", "        pass\n",
      "a device's test of the top-k ids against its expert's global id is its column of the reference's one-hot",
      "pytest:tests/translate/test_one_hot_columns.py::test_a_device_mask_per_local_expert_by_global_id_verifies"),
    M("one-hot-window-any-lanes", "    return c if np.array_equal(value, np.broadcast_to(lane, y.shape)) else None\n",
      "    return c\n",
      "only a test against c + each element's position is the window [c, c + n) of the one-hot",
      "pytest:tests/translate/test_one_hot_columns.py::test_no_window_of_a_compare_against_positions_reversed"),
    M("one-hot-sum-unrecorded", "    one_hot_columns.record(ev, equal, \"EQ\", columns, across)\n", "",
      "a scatter's one-hot sum holds a one-hot of its columns: a device's test against its experts' ids is a window of it",
      "pytest:tests/translate/test_one_hot_columns.py::test_a_window_of_the_one_hot_a_scatter_of_weights_builds"),
    M("select-scaled-branch", "        # below is stated for the select itself, which the sums and dots over it read\n        p, a, b = chosen.args\n",
      "        # below is stated for the select itself, which the sums and dots over it read\n        p, _, b = chosen.args\n",
      "f * select(p, x, 0): the select under the factor is x * p, not (f * x) * p",
      "pytest:tests/translate/test_index_compares.py::test_a_select_of_a_scaled_branch_states_the_unscaled_product"),
    # -- a weighted sum of a gather's picks as the dot it is (translate/picks.py, reductions.py) ---------
    M("weighted-sum-factor-dropped", "as_dot = ev.scaled(ev.transpose_term(dot_with_facts(ev, spec, a, y, inner), perm), factor)",
      "as_dot = ev.scaled(ev.transpose_term(dot_with_facts(ev, spec, a, y, inner), perm), 1)",
      "f * sum(bcast(a) * y) is f times the dot of a with y, not the dot alone",
      "pytest:tests/translate/test_weighted_sums.py::test_a_weighted_sum_of_scaled_picks_is_the_scaled_dot"),
    M("masked-local-any-window", "if window.hi - lo != n or _clamped_offset(ev, idx, n) != (x, lo):",
      "if _clamped_offset(ev, idx, n) != (x, lo):",
      "the gates masked to [lo, lo + n) only are the gates at the owned ids: a wider mask keeps ids the clamp moves",
      "pytest:tests/translate/test_weighted_sums.py::test_no_owned_ids_for_another_mask_or_clamp"),
    M("masked-local-any-clamp", 'if ends != {"minimum": n - 1, "maximum": 0}:', "if False:",
      "only clamp(x - lo, 0, n - 1) leaves x - lo for every id of the window",
      "pytest:tests/translate/test_weighted_sums.py::test_no_owned_ids_for_another_mask_or_clamp"),
    # -- the verifier child's limits (verify/sandbox.py) and what the memo keeps (pipeline.py) ----------
    M("sandbox-no-cpu-limit", "    _limit_cpu(cpu_cap(options.verify_timeout_seconds)[0])\n", "",
      "EQUIVCI_VERIFY_TIMEOUT bounds the child's CPU time: a search past it is `unproven`, never a verdict",
      "pytest:tests/verify/test_sandbox.py::test_a_run_over_the_cpu_time_limit_is_unproven"),
    M("sandbox-no-stall", "            elif time.perf_counter() - since >= stall:\n", "            elif False:\n",
      "a child whose CPU time stops advancing is stalled: it ends `unproven`, not when it likes",
      "pytest:tests/verify/test_sandbox.py::test_a_stalled_run_ends_when_its_cpu_time_stops_advancing"),
    M("splat-held-whole", "            value = np.broadcast_to(np.asarray(value.flat[0]), value.shape)\n", "",
      "a constant of one value is held as a view of that value, not an array of its shape (memory at 405B)",
      "pytest:tests/translate/test_arrays.py::test_a_constant_of_one_value_is_held_as_a_view_of_that_value"),
    M("memo-keeps-limited", "        if not result.limited:\n", "        if True:\n",
      "an `unproven` stopped by the run's limits (not in the cache key) must not stand in for a rerun's verdict",
      "pytest:tests/verify/test_sandbox.py::test_a_result_stopped_by_a_limit_is_not_kept_in_the_memo"),
    # -- expert choice on {data, expert} devices (issue 13: constants.py, rules/slices.py, relayouts.py,
    # reductions.py) ---------------------------------------------------------------------------------------
    M("two-dim-window-offset", "across=(d, i, w)", "across=(d, 0, w)",
      "a table cut along two dims is the window at its own offset along the second dim too, not the first rows",
      "pytest:tests/translate/test_constant_windows.py::test_a_table_cut_along_two_dims_is_found_at_a_shard_offset"),
    M("reorder-nested-dropped", "    ).then(union(e).with_(w.slice(k, a, b).slice(d2, c, g))),\n",
      "    ).then(union(e).with_(e)),\n",
      "a device's rows and experts of the top-k values are windows of the reference's top-k values, which "
      "are a window of the sort along the sorted dim: no two-level reorder reaches it",
      "pytest:tests/translate/test_expert_choice.py::test_expert_choice_on_data_and_expert_shards_verifies[sliced]"),
    M("canonical-swap-in-place", "if composed == identity and not swapped:", "if composed == identity:",
      "a dot whose operands swap without moving a dim (one of them has no free dims: gates times an "
      "expert's rows) is read in the canonical order too, or a vmapped combine reads it the other way",
      "pytest:tests/translate/test_expert_choice.py::test_expert_choice_on_data_and_expert_shards_verifies[sharded-vmapped]"),
    M("summed-batches-any-reducer",
      'if reducer == "add" and (contracted := summed_batches(ev, x, dims, inst.shape)) is not None:',
      "if (contracted := summed_batches(ev, x, dims, inst.shape)) is not None:",
      "only a sum over a dot's batch dims is the dot contracting them (a max over the experts is none)",
      "pytest:tests/translate/test_expert_choice.py::test_no_contraction_for_another_reducer_or_a_free_dim"),
    M("contraction-sorted-rhs",
      "return dataclasses.replace(spec, lhs_contract=tuple(p for p, _ in pairs), rhs_contract=tuple(q for _, q in pairs))",
      "return dataclasses.replace(spec, lhs_contract=tuple(p for p, _ in pairs), rhs_contract=spec.rhs_contract)",
      "the contraction pairs move together: each lhs dim stays paired with its rhs dim",
      "pytest:tests/translate/test_expert_choice.py::test_contraction_pairs_in_the_lhs_order_are_the_same_dot"),
    M("conv-feature-groups", "    if dims.groups != 1:\n        return depthwise(",
      "    if dims.groups != 1 and False:\n        return depthwise(",
      "a grouped convolution sums each output feature over its group's input features only: no dot over all of them",
      "pytest:tests/translate/test_convolutions.py::test_near_miss_grouped_and_input_dilated_convolutions_stay_opaque"),
    M("depthwise-kernel-row-fixed", "[(k, k + 1) if c in spatial else (0, n)", "[(0, 1) if c in spatial else (0, n)",
      "a depthwise convolution's window at offset k is scaled by the kernel's row at k, not by one row for all",
      "pytest:tests/translate/test_convolutions.py::test_a_depthwise_convolution_is_the_sum_of_its_windows_times_the_kernel_rows",
      "pytest:tests/translate/test_convolution_shards.py::test_sharded_convolutions_verify"),
    M("depthwise-dilation-ignored", "start = k * dims.dilation[i]", "start = k",
      "a dilated depthwise kernel's offset k reads the input k * dilation further, not k",
      "pytest:tests/translate/test_convolutions.py::test_a_depthwise_convolution_is_the_sum_of_its_windows_times_the_kernel_rows"),
    M("conv-batch-groups", 'or attrs.get("batch_group_count", "1") != "1":', ":",
      "a batch-grouped convolution (a weight gradient) sums over batch groups: no dot of one batch's windows",
      "pytest:tests/translate/test_convolutions.py::test_near_miss_grouped_and_input_dilated_convolutions_stay_opaque"),
    M("conv-stride-ignored", "step = stride if out > 1 else 1", "step = 1",
      "a strided convolution reads every stride-th window: the windows of consecutive positions are others",
      "pytest:tests/translate/test_convolutions.py::test_a_convolution_is_the_dot_of_its_windows_with_the_kernel"),
    M("conv-padding-symmetric", "x = shapes.padded(ev, x, at, *pad, zero)", "x = shapes.padded(ev, x, at, pad[0], pad[0], zero)",
      "the low and high padding differ (a causal or SAME padding of an even window): each end gets its own",
      "pytest:tests/translate/test_convolutions.py::test_a_convolution_is_the_dot_of_its_windows_with_the_kernel"),
    M("conv-kernel-dilation-ignored", "start = k * dilation", "start = k",
      "a dilated kernel's offset k reads the input k * dilation further, not k",
      "pytest:tests/translate/test_convolutions.py::test_a_convolution_is_the_dot_of_its_windows_with_the_kernel"),
    M("conv-kernel-dims-reversed", '"i" + "".join(str(i) for i in range(len(dims.size)))',
      '"i" + "".join(str(i) for i in reversed(range(len(dims.size))))',
      "each window offset is contracted with the kernel's spatial dim of the same input dim (a square 2-D kernel "
      "transposed is another kernel)",
      "pytest:tests/translate/test_convolutions.py::test_a_convolution_is_the_dot_of_its_windows_with_the_kernel"),
    M("conv-padding-not-reference", "    ev.inner_values.extend(_padding(patches))\n", "",
      "a device's narrower padding zeros are windows of the reference's only where those are reference values: "
      "an input-feature shard's padded convolution psummed is the reference's",
      "pytest:tests/translate/test_convolution_shards.py::test_sharded_convolutions_verify"),
    M("convert-above-concat", 'x.op in ("reshape", "transpose", "concat"):', 'x.op in ("reshape", "transpose"):',
      "a rounding of a concatenation is the concatenation of the roundings: a time shard joined with its "
      "neighbours' frames, then cast to bf16, is made of the casts of the input's windows",
      "pytest:tests/translate/test_roundings_below_layouts.py",
      "pytest:tests/translate/test_convolution_shards.py::test_sharded_convolutions_verify"),
    M("bf16-splat-inexact", "is not None and _bf16_exact(v):", "is not None:",
      "only a splat bf16 holds exactly is that splat in bf16: 0.1 cast to bf16 is 0.10009765625",
      "pytest:tests/translate/test_roundings_below_layouts.py"),
    M("conv-window-column-first", "c = columns[-1] if columns else 0", "c = columns[0] if columns else 0",
      "a strided window cut as the rows of a window that ends at its last element read: a time shard with its "
      "left neighbour's frame then cuts the same rows as the reference's padded input",
      "pytest:tests/translate/test_convolution_shards.py::test_sharded_convolutions_verify"),
    M("one-sided-split-dropped", "split_contraction(ev, dot_spec, lhs, rhs, one_sided=True)",
      "split_contraction(ev, dot_spec, lhs, rhs, one_sided=False)",
      "a contraction one operand's reshape merged (a patchified image) is the sum over the split dims with the "
      "other operand split alike: a patch convolution's dot",
      "pytest:tests/translate/test_convolutions.py::test_a_patchified_dot_is_stated_as_the_dot_of_the_patches_with_the_kernel_split_alike"),
    M("convert-above-relayouts", 'x.op in ("reshape", "transpose", "concat"):', 'x.op in ("reshape", "concat"):',
      "a rounding is elementwise, so a transposed value rounded is the rounding transposed: a bf16 conv kernel "
      "transposed from the patch weight, then cast, is the cast weight the reference's dot reads",
      "pytest:tests/translate/test_convolution_shards.py::test_sharded_convolutions_verify"),
    M("convert-unit-reshape-pushed", 'if x.op != "reshape" or inserted_unit_dims(x.args[0].shape, x.shape) is None:',
      "if True:",
      "a rounding of a reshape that only inserts size-1 dims stays on top (the moved form stated beside it): a "
      "device's one head cast to f32 for RoPE is otherwise read as a broadcast and no longer meets the reference",
      "pytest:tests/translate/test_rounded_unit_heads.py::test_the_per_layer_style_with_one_head_per_device_verifies"),
    # -- a device's one head merged back and projected out (shapes.unit_dims_moved, collectives.py) ----
    M("unit-dims-moved-kept-swapped", "perm = tuple(kept[:-1] + units + kept[-1:])",
      "perm = tuple(kept[:-2] + kept[-1:] + units + kept[-2:-1])",
      "only size-1 dims move by a reshape: a squeeze stated with two larger dims swapped is another value",
      "pytest:tests/translate/test_unit_head_merges.py::test_a_squeeze_with_its_unit_dims_moved_computes_what_xla_computes"),
    M("written-combination-drops-member",
      '    for m in members[1:]:\n        acc = ev.mk("binary", (reducer,), [acc, m]',
      '    for m in members[2:]:\n        acc = ev.mk("binary", (reducer,), [acc, m]',
      "the reduction of members reshaped alike, as written, reads every member",
      "pytest:tests/translate/test_unit_head_merges.py::test_a_sum_of_members_reshaped_alike_is_stated_as_written"),
    M("unit-contractions-pairs-crossed",
      "[(at_x[i], at_y[j]) for i, j in zip(own_contract, other_contract)]",
      "[(at_x[i], at_y[j]) for i, j in zip(own_contract, other_contract[::-1])]",
      "a squeezed operand's contracted dims keep their partners when its size-1 dims join the contraction",
      "pytest:tests/translate/test_split_head_contractions.py::test_a_squeezed_operand_is_stated_with_its_unit_dims_contracted"),
    # -- powers of two moved out of bf16 dots (reductions.power_of_two_out, literals.power_of_two_literal)
    # -- a reshape that leaves a concatenation's dim alone, on the parts (builder.reshaped_parts) -------
    M("reshaped-parts-any-dim", "if out[j] == joined.shape[d] and int(np.prod(out[:j])) == before:",
      "if out[j] == joined.shape[d]:",
      "the joined dim maps to the output dim of its size with as many elements before it, not any of its size",
      "pytest:tests/translate/test_reshaped_concats.py::"
      "test_only_a_reshape_that_leaves_the_joined_dim_alone_is_stated_on_the_parts"),
    M("pow2-dot-any-factor", "if c and abs(c) == power_of_two(c) and t.args[1 - j].shape == t.shape:",
      "if c and t.args[1 - j].shape == t.shape:",
      "only a power of two scales a bf16 product exactly: 0.3 * x rounds in bf16, 0.3 * dot(x, y) does not",
      "pytest:tests/translate/test_power_of_two_dot_scales.py::test_only_a_power_of_two_is_moved_in_front_of_the_dot"),
    M("pow2-literal-any-number", "return value if mantissa == 0.5 else None", "return value",
      "a bf16 literal's printed decimal is its number only where bf16 holds it exactly: a power of two",
      "pytest:tests/translate/test_power_of_two_dot_scales.py::test_only_a_bf16_power_of_two_literal_is_read_as_its_number"),
)


# -- applying a mutant to a copy of the package ------------------------------------------------------
def locate(mutant: Mutant, package: Path = PACKAGE) -> Path:
    hits = [(p, p.read_text().count(mutant.snippet)) for p in sorted(package.rglob("*.py"))]
    hits = [(p, n) for p, n in hits if n]
    if len(hits) != 1 or hits[0][1] != 1:
        where = ", ".join(f"{p.relative_to(package.parent)} x{n}" for p, n in hits) or "nowhere"
        raise LookupError(f"mutant {mutant.name}: its snippet must occur exactly once in equivci/, found {where}")
    return hits[0][0]


def family(mutant: Mutant) -> str:
    """The module a mutant edits (a path in equivci/): its family, the facts or guards of one module."""
    return locate(mutant).relative_to(PACKAGE).as_posix()


def family_sample(mutants: tuple[Mutant, ...] = MUTANTS, named: frozenset[str] = frozenset()) -> list[Mutant]:
    """The first mutant of each family in the table's order, and the mutants `named`: the default
    suite's share (every module a mutant edits still has one killed there; the slow test runs all)."""
    firsts: dict[str, Mutant] = {}
    for m in mutants:
        firsts.setdefault(family(m), m)
    chosen = {m.name for m in firsts.values()} | set(named)
    return [m for m in mutants if m.name in chosen]


def mutated_source(mutant: Mutant) -> tuple[Path, str]:
    """The file the mutant edits (in equivci/) and its mutated text."""
    path = locate(mutant)
    text = path.read_text().replace(mutant.snippet, mutant.replacement, 1)
    if mutant.imports is not None:
        old, new = mutant.imports
        if text.count(old) != 1:
            raise LookupError(f"mutant {mutant.name}: {old!r} must occur once in {path.name}")
        text = text.replace(old, new, 1)
    return path, text


def mutated_copy(mutant: Mutant | None, root: Path) -> Path:
    """root/equivci: a copy of the package with the mutant applied."""
    return edited_copy(None if mutant is None else mutated_source(mutant), root)


def edited_copy(edit: tuple[Path, str] | None, root: Path, source: Path = PACKAGE) -> Path:
    """root/equivci: a copy of the package (`source`, by default the working tree's) with one file (a
    path in equivci/) replaced by a text."""
    target = root / "equivci"
    shutil.copytree(source, target, ignore=None if source != PACKAGE else shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        path, text = edit
        edited = target / path.relative_to(PACKAGE)
        edited.write_text(text)
        # its bytecode, copied from the compiled package, is of the unmutated text: never let it stand in
        for stale in (edited.parent / "__pycache__").glob(f"{edited.stem}.*.pyc"):
            stale.unlink()
    return target


def compiled_package(work: Path) -> Path:
    """A copy of the unmutated package with its bytecode written, which each mutant's copy takes along
    (copytree keeps the sources' times, by which Python checks a .pyc). Without it every fork compiled
    the whole package from source (under PYTHONDONTWRITEBYTECODE nothing is ever cached): about 0.8 s
    of CPU per mutant, most of a sampled mutant's import."""
    pristine = edited_copy(None, work / "compiled")
    if not compileall.compile_dir(pristine, quiet=1, workers=1):
        raise RuntimeError(f"the package does not compile: {pristine}")
    return pristine


# -- captures (once, by the unmutated package) -------------------------------------------------------
def capture_models(names: list[str], out: Path, workers: int = 2) -> Path:
    """The near-miss models' captures, `workers` at a time (the product's capture_model, whose
    children one capture server forks)."""
    if out.exists() and set(names) <= set(pickle.loads(out.read_bytes())):
        return out  # captured by an earlier run (captures do not depend on the mutated engine)
    from concurrent.futures import ThreadPoolExecutor

    from equivci.capture.run import capture_model
    from equivci.manifest import load_manifest

    sys.path.insert(0, str(SOUNDNESS))
    from near_miss_cases import MANIFEST

    manifest = load_manifest(MANIFEST)
    models = {m.name: m for m in manifest.models}
    with ThreadPoolExecutor(workers) as pool:
        captured = list(pool.map(lambda n: capture_model(models[n], manifest), names))
    out.write_bytes(pickle.dumps(dict(zip(names, captured))))
    return out


# -- the batch child: one process per worker, one fork per mutant ------------------------------------
# The child imports the heavy dependencies once (egglog, jax, numpy, pytest), never equivci; each fork
# puts one mutated copy first on sys.path, imports equivci from it and runs that mutant's checks.
def batch_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import egglog  # noqa: F401
    import jax.numpy  # noqa: F401 - 1.5 s of import per fork otherwise; its backend starts later, in the fork
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import yaml  # noqa: F401

    assert not any(m == "equivci" or m.startswith("equivci.") for m in sys.modules), "imported before the fork"
    for job in spec["jobs"]:
        out = Path(job["out"])
        pid = os.fork()
        if pid == 0:
            try:
                try:
                    observed = _observe(job, spec["captures"])
                except BaseException as exc:  # noqa: BLE001 - e.g. a mutant that breaks an import: a crash
                    observed = {"error": f"{type(exc).__name__}: {exc}"}
                _write(out, observed)
            finally:
                os._exit(0)
        t0 = time.monotonic()
        deadline = t0 + job.get("timeout", CHILD_TIMEOUT)
        while (ended := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                during = _progress(out)
                _write(out, {"timeout": True, "during": during.read_text() if during.exists() else "the import"})
                break
            time.sleep(0.05)
        else:
            if not out.exists():  # the mutant killed its own fork (a segfault in egglog, ...): a crash
                _write(out, {"error": f"the fork died without an answer (wait status {ended[1]})"})
    return 0


def _progress(out: Path) -> Path:
    """Where a fork notes the check it is on (and its rank among the checks): a timeout then says whether
    the mutant hung in one check (a loop that never ends) or was still going through them."""
    return out.with_suffix(".progress")


def _note(job: dict, check: str, started: int) -> None:
    total = len(job["models"]) + len(job["pytest"])
    _progress(Path(job["out"])).write_text(f"{check}, check {started + 1} of {total}")


def _write(out: Path, observed: dict) -> None:
    """Whole or not at all: the parent reads answers while the batches run."""
    part = out.with_suffix(".part")
    part.write_text(json.dumps(observed))
    os.replace(part, out)


class _Failures:
    """A pytest plugin that keeps the failed reports; with `stop_at_kill`, the run stops at the first
    failed assertion (a mutant is killed by one: the tests after it cannot change the outcome), while a
    crash lets the next test run, which may still kill it."""

    def __init__(self, stop_at_kill: bool = False) -> None:
        self.failed: list[tuple[str, str]] = []
        self.stop_at_kill = stop_at_kill
        self.session = None

    def pytest_sessionstart(self, session) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.failed.append((report.nodeid, crash.message if crash is not None else str(report.longrepr)[-300:]))
            if self.stop_at_kill and self.session is not None and _asserted({"failed": self.failed[-1:]}):
                self.session.shouldstop = "a failed assertion kills the mutant"


def _observe(job: dict, captures: str) -> dict:
    """In the fork: the verdicts of the job's models and the failures of its tests."""
    sys.path.insert(0, job["root"])
    sys.path.insert(1, str(SOUNDNESS))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (job["root"], os.environ.get("PYTHONPATH", "")) if p)
    import engine_api
    import pytest
    from near_miss_cases import MANIFEST

    import equivci

    observed: dict = {"package": equivci.__file__, "models": {}, "pytest": []}
    captured = pickle.loads(Path(captures).read_bytes()) if job["models"] else {}
    started = 0
    for name in job["models"]:
        _note(job, f"model:{name}", started)
        started += 1
        try:
            r = engine_api.verify_captured(MANIFEST, name, captured[name])
            messages = " ".join(f.message for f in r.findings)
            observed["models"][name] = {"status": r.status.value, "detail": messages[:300],
                                        "crash": r.status.value == "error" or "internal error" in messages}
        except Exception as exc:  # noqa: BLE001 - a crash of the mutated engine: reported, not a kill
            observed["models"][name] = {"status": "error", "crash": True, "detail": f"{type(exc).__name__}: {exc}"[:300]}
        if job.get("first") and (observed["models"][name]["status"] == "verified") != (_expected_model(name) == "verified"):
            return observed  # the first wrong verdict decides (a sampled mutant needs no second one)
        if job["name"] != BASELINE and _model_kill(name, observed["models"][name]):
            return observed  # killed: judge() stops at the first kill, so the checks after it cannot change the outcome
    for args in job["pytest"]:
        _note(job, f"pytest:{' '.join(args)}", started)
        started += 1
        plugin = _Failures(stop_at_kill=job["name"] != BASELINE)
        # `-m ""`: the ini's `-m 'not slow'` would deselect a named test marked slow, and a check that runs
        # nothing kills nothing
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "", "--rootdir", str(REPO), *args], plugins=[plugin])
        observed["pytest"].append({"args": args, "exit": int(code), "failed": plugin.failed})
        if job.get("first") and code != 0 or job["name"] != BASELINE and _asserted(observed["pytest"][-1]):
            break
    return observed


@dataclasses.dataclass
class Outcome:
    mutant: str
    verdict: str  # killed | survived | crashed | timeout
    how: str


def _expected_model(name: str) -> str:
    from near_miss_cases import VERIFIED

    return "verified" if name in VERIFIED else "not verified"


def _model_kill(model: str, r: dict) -> str | None:
    """Why a model's verdict kills the mutant: a buggy model verified, or a correct one refused by an
    engine that ran to a verdict (a crash is no kill)."""
    want = _expected_model(model)
    if r["status"] == "verified" and want != "verified":
        return f"{model}: verified, must not be"
    if want == "verified" and r["status"] != "verified" and not r["crash"]:
        return f"{model}: {r['status']}, must be verified"
    return None


def _asserted(run_: dict) -> list[tuple[str, str]]:
    """The tests of a pytest check that failed on an assertion (a kill; any other failure is a crash)."""
    return [(node, msg) for node, msg in run_["failed"] if msg.startswith(("AssertionError", "assert"))]


def judge(name: str, observed: dict, package: Path) -> Outcome:
    """Killed: an assertion on a verdict failed (a buggy model verified, a correct one refused by an
    engine that ran to the end, or a test failing on an AssertionError). A crash is not a kill."""
    if observed.get("timeout"):
        return Outcome(name, "timeout", f"no answer in the time allowed; it was on {observed.get('during', '?')}")
    if "error" in observed:
        return Outcome(name, "crashed", observed["error"][:200])
    assert Path(observed["package"]).resolve().parent == package.resolve(), ("the fork imported", observed["package"])
    crashes = []
    for model, r in observed["models"].items():
        if kill := _model_kill(model, r):
            return Outcome(name, "killed", kill)
        if _expected_model(model) == "verified" and r["status"] != "verified":
            crashes.append(f"{model}: {r['detail'][:120]}")
    for run_ in observed["pytest"]:
        if asserted := _asserted(run_):
            return Outcome(name, "killed", f"{asserted[0][0]}: {asserted[0][1][:100]}")
        if run_["exit"] not in (0,):
            crashes.append(f"pytest {' '.join(run_['args'])[:80]}: exit {run_['exit']} {run_['failed'][:1]}")
    return Outcome(name, "crashed" if crashes else "survived", "; ".join(crashes))


def _job(name: str, edit: tuple[Path, str] | None, kills: tuple[str, ...], work: Path, compiled: Path,
         first: bool = False) -> dict:
    root = work / f"pkg-{len(list(work.glob('pkg-*')))}"
    edited_copy(edit, root, compiled)
    return {"name": name, "root": str(root), "out": str(root / "observed.json"), "first": first,
            "models": [k.split(":", 1)[1] for k in kills if k.startswith("model:")],
            "pytest": [k.split(":", 1)[1].split() for k in kills if k.startswith("pytest:")]}


BASELINE = "(unmutated)"


def run(mutants: list[Mutant], work: Path, workers: int = 2, baseline_tests: bool = True,
        log=print) -> tuple[Outcome, list[Outcome]]:
    """The unmutated baseline over every check (tests included unless `baseline_tests` is false:
    the default suite runs them anyway), then each mutant over its own checks."""
    edits = [Edit(m.name, mutated_source(m), m.kills) for m in mutants]  # every snippet occurs once, up front
    checks = tuple(sorted({k for m in mutants for k in m.kills if baseline_tests or k.startswith("model:")}))
    return run_edits(edits, checks, work, work / "captures.pkl", workers, log=log)


@dataclasses.dataclass(frozen=True)
class Edit:
    """A mutant as the harness runs it: a name, the file it replaces (path in equivci/, new text) and
    its checks."""

    name: str
    edit: tuple[Path, str]
    kills: tuple[str, ...]


def run_edits(edits: list[Edit], baseline_checks: tuple[str, ...], work: Path, captures: Path, workers: int = 2,
              timeout: float = CHILD_TIMEOUT, first: bool = False, budget: float | None = None,
              log=print) -> tuple[Outcome, list[Outcome]]:
    """The unmutated package over `baseline_checks`, then each edit over its own checks, in `workers`
    batch processes; `first`: a mutant's checks stop at the first one that fails. Each outcome is
    logged as it comes; after `budget` seconds the batches are stopped and the mutants not run yet
    are left out of the outcomes."""
    models = sorted({k.split(":", 1)[1] for e in edits for k in (*e.kills, *baseline_checks) if k.startswith("model:")})
    captures = capture_models(models, captures, workers)
    compiled = compiled_package(work)
    jobs = [_job(BASELINE, None, baseline_checks, work, compiled)]
    jobs += [_job(e.name, e.edit, e.kills, work, compiled, first) for e in edits]
    for job in jobs[1:]:
        job["timeout"] = timeout
    # The unmutated run goes through every check (a mutant stops at its first failure): it gets twice
    # a mutant's time, so a loaded machine does not turn it into "no figures".
    jobs[0]["timeout"] = max(CHILD_TIMEOUT, 2 * timeout)
    # Each job, in order, to the batch with the least work so far (a fork's import of the package and
    # its checks): the unmutated run has every model's check, so dealing jobs round-robin left its
    # batch running long after the other.
    batches: list[list[dict]] = [[] for _ in range(workers)]
    for job in jobs:
        min(batches, key=lambda b: sum(1 + len(j["models"]) + len(j["pytest"]) for j in b)).append(job)
    procs = []
    for k, batch in enumerate(batches):
        spec = work / f"batch{k}.json"
        spec.write_text(json.dumps({"captures": str(captures), "jobs": batch}))
        procs.append(subprocess.Popen([sys.executable, "-P", __file__, "--batch", str(spec)], cwd=REPO,
                                      env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, start_new_session=True))
    outcomes: dict[int, Outcome] = {}

    def collect() -> None:
        for k, job in enumerate(jobs):
            out = Path(job["out"])
            if k in outcomes or not out.exists():
                continue  # (a job its batch never answered, the batch having died first, is not run)
            observed = json.loads(out.read_text())
            outcomes[k] = judge(job["name"], observed, Path(job["root"]) / "equivci")
            log(f"{outcomes[k].verdict:9s} {outcomes[k].mutant:28s} {outcomes[k].how}")

    stop = None if budget is None else time.monotonic() + budget
    while any(proc.poll() is None for proc in procs):
        if stop is not None and time.monotonic() > stop:
            for proc in procs:  # the batch and its fork
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
            break
        collect()
        time.sleep(1)
    else:
        collect()
        for job in (j for k, j in enumerate(jobs) if k not in outcomes):
            log(f"not run   {job['name']:28s} its batch process ended before it")
    if 0 not in outcomes:
        raise RuntimeError("the unmutated package's checks did not finish within the budget")
    return outcomes[0], [outcomes[k] for k in sorted(outcomes) if k]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--sample", action="store_true", help="the first mutant of each module it edits only")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.batch:
        return batch_main(args.batch)
    table = family_sample() if args.sample else list(MUTANTS)
    chosen = [m for m in table if not args.only or m.name in args.only.split(",")]
    if args.list:
        for m in chosen:
            print(f"{m.name:28s} {locate(m).relative_to(REPO)}: {m.reason}")
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verifier-mutants-") as tmp:
        baseline, outcomes = run(chosen, Path(tmp), args.workers)
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("killed", "survived", "crashed", "timeout")}
    if baseline.verdict != "survived":
        print(f"the unmutated package fails its own checks: {baseline.verdict} {baseline.how}")
    print(f"{len(outcomes)} mutants: " + ", ".join(f"{n} {v}" for v, n in counts.items())
          + f" ({time.perf_counter() - t0:.0f} s)")
    return 0 if baseline.verdict == "survived" and counts["killed"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
