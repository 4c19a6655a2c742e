"""The mutation tool over the verdict-deciding modules: a seeded random sample of mutmut's mutants per
module, each run against the verifier's checks with a timeout; prints killed / survived / timed out /
total and the kill rate with a 95 % confidence interval.

mutmut (pinned in the test extra) generates the mutants: its operators (numbers, strings, operators,
comparisons, names, arguments, ...) over every function and method of a module. Running mutmut itself
takes hours here (one module has hundreds of mutants, and its first step re-runs the tests under
trampolines), so this tool draws N of each module's mutants with a seed and runs them through the
harness of bench/verifier_mutants.py: each mutant is a copy of the package with one file replaced,
imported in a fork of a worker that has egglog, numpy and pytest loaded. Its checks:

* the default suite's near-miss models (`DEFAULT` of tests/soundness/near_miss_cases.py: for each
  family of side conditions a correct model and a buggy one), captured once by the unmutated package
  and verified by the mutated engine without the oracle: a buggy model `verified`, or a correct one not;
* the in-process tests of the term language, rules, semantics, the translation against XLA, windows,
  candidates and layers (`TESTS`), and for the loop modules their own tests (`MODULE_TESTS`).

A mutant is killed when a check fails and the unmutated package passes them all; the checks stop at
the first failure (with `--past-errors`, at the first failure by an assertion only). "killed by an error" (the mutated engine raised, or a test failed on an exception
other than AssertionError) is counted apart from "killed by an assertion", and both are detection.

    nice -n 10 python bench/mutation_tool.py --per-module 8 --seed 1         # every verdict-deciding module
    python bench/mutation_tool.py --per-module 20 --modules equivci/translate/masks.py
    python bench/mutation_tool.py --list --modules equivci/prove/saturate.py  # the sampled mutants, not run
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import difflib
import importlib.util
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The engine: the term language and rules, HLO -> terms, the proofs and the layers they are split into.
# (The oracle, capture/oracle.py, decides `mismatch` in a JAX child process: its mutants need a JAX run
# per mutant and are left to the curated mutants and tests/capture.)
VERDICT_PACKAGES = ("equivci/terms", "equivci/translate", "equivci/prove", "equivci/layers")


def in_process(files: tuple[str, ...]) -> str:
    """The node ids of the tests of tests/translate/FILES that run in this process (one pytest run): those
    that take no fixture of their file (its fixtures capture JAX models in child processes) and no
    tmp_path, and are not slow. Read from the files, so a test added there is run too."""
    ids = []
    for name in files:
        tree = ast.parse((REPO / "tests" / "translate" / name).read_text())
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        fixtures = {f.name for f in functions if any("fixture" in ast.unparse(d) for d in f.decorator_list)}
        ids += [
            f"tests/translate/{name}::{f.name}"
            for f in functions
            if f.name.startswith("test_")
            and not {a.arg for a in f.args.args} & (fixtures | {"tmp_path", "tmp_path_factory"})
            and not any("slow" in ast.unparse(d) for d in f.decorator_list)
        ]
    return " ".join(ids)


TESTS = (
    "tests/terms",
    "tests/translate/test_strided_slices.py",
    "tests/translate/test_constant_windows.py",
    "tests/translate/test_sorts.py",
    "tests/translate/test_translation_against_xla.py",
    "tests/translate/test_window_forms.py",
    "tests/translate/test_attributes.py",
    "tests/translate/test_device_ids.py",
    "tests/translate/test_literals.py",
    "tests/translate/test_collective_values.py",
    "tests/prove/test_budget.py",
    "tests/prove/test_candidates.py",
    "tests/layers/test_layers.py",
    "tests/soundness/test_facts_numeric.py",
    "tests/soundness/test_rule_properties.py",
    "tests/translate/test_arrays.py",
    "tests/translate/test_permutations.py",
    # the in-process tests of files whose other tests capture JAX models (one pytest run)
    " ".join(
        f"tests/translate/{f}::test_{t}"
        for f, names in (
            ("test_vocab_parallel.py", ("logsumexp_guards_are_identities", "tiles_needs_every_value_exactly_once",
                                        "a_mask_narrows_only_its_own_ids_and_never_past_the_dtype",
                                        "bounds_pass_a_convert_only_where_the_new_dtype_holds_them",
                                        "a_range_test_of_integers_with_constant_ends_is_its_window",
                                        "ids_used_by_several_lookups_are_valid_for_the_smallest_table",
                                        "a_clipped_index_is_a_window_of_the_ids_it_can_hold",
                                        "an_offset_range_test_is_one_of_the_ids_only_where_the_offset_cannot_wrap")),
            ("test_dot_relayouts.py", ("a_dot_of_a_sliced_head_split_weight_is_the_window_of_the_dot",
                                       "several_consecutive_contracting_dims_are_one_merged_contraction",
                                       "a_reshape_that_regroups_a_contracting_dim_is_not_lifted",
                                       "contracting_dims_in_different_orders_are_not_merged",
                                       "contracting_dims_no_operand_split_are_not_merged")),
            ("test_routing.py", ("mask_lemma", "numeric_ops_follow_the_term_semantics")),
            ("test_squeezes.py", ("a_row_plus_a_broadcast_bias_is_the_squeezed_sum",
                                  "squeezes_of_one_shape_a_constant_and_a_select_lift_together",
                                  "integer_arithmetic_on_a_row_is_not_lifted", "squeezes_of_different_shapes_are_not_lifted",
                                  "an_operand_that_is_neither_squeezed_broadcast_nor_constant_is_not_lifted")),
            ("test_regroup.py", ("elementwise_ops_and_a_broadcast_on_groups_are_the_reshaped_ops_on_the_rows",
                                 "a_broadcast_that_moves_the_split_dims_is_not_lifted",
                                 "only_ops_that_keep_the_groups_apart_are_regrouped")),
            ("test_unit_broadcasts.py", ("a_kept_unit_dim_is_a_new_dim_of_size_one",
                                         "a_broadcast_along_unit_dims_only_has_no_other_form")),
            ("test_evaluator.py", ("saved_tp_sample_is_proved", "saved_gspmd_sample_is_proved",
                                   "saved_tp_sample_without_all_reduce_is_not_proved",
                                   "saved_tp_sample_with_swapped_shards_is_not_proved",
                                   "all_reduce_becomes_the_same_sum_on_every_device",
                                   "partition_id_offsets_fold_to_static_slices", "wrong_partition_offset_is_not_proved",
                                   "dynamic_slice_start_is_clamped_like_xla",
                                   "a_start_known_only_as_a_term_gives_dynamic_terms", "pulled_out_factor_is_an_identity",
                                   "factors_are_only_pulled_out_where_that_is_exact_and_linear",
                                   "elided_constants_are_never_one_term", "a_reshaped_slice_of_a_reshape_is_the_window_it_holds")),
        )
        for t in names
    ),
    # the in-process tests of the other translate test files (about 20 s; stop 25)
    in_process(("test_dot_orientation.py", "test_gather_through_broadcast.py", "test_group_pieces.py",
                "test_offset_windows.py", "test_outside_masks.py", "test_picks.py", "test_pieces.py",
                "test_relaid_windows.py", "test_stacked_gathers.py", "test_transpose_pairs.py",
                "test_two_dim_windows.py", "test_unary_through_reshapes.py", "test_window_of_reshaped_window.py")),
)
# Tests that exercise one module's code and capture JAX models in child processes (about two minutes
# each here): too slow for every mutant, they run for that module's mutants only, first (as mutmut
# runs the tests that reach the mutated function).
MODULE_TESTS = {
    "equivci/translate/unroll.py": ("tests/prove/test_unroll.py",),
    "equivci/prove/loops.py": ("tests/prove/test_loops.py",),
    # the where(mask, rows, 0) form of a vocabulary-parallel lookup (about 30 s)
    "equivci/translate/masks.py": ("tests/translate/test_vocab_parallel.py::test_vocab_parallel_programs_verify[embed]",),
}


def _harness():
    spec = importlib.util.spec_from_file_location("verifier_mutants", REPO / "bench" / "verifier_mutants.py")
    module = sys.modules.setdefault("verifier_mutants", importlib.util.module_from_spec(spec))
    if not hasattr(module, "run_edits"):
        spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Sampled:
    name: str  # module:line#k
    path: Path
    text: str  # the whole mutated module
    change: str  # the changed line, before -> after


class Mutants:
    """The mutants mutmut makes of one module (it mutates only inside functions and methods); each
    is rendered only when drawn (a module has hundreds, and a render re-prints the whole module)."""

    def __init__(self, path: Path, code: str | None = None) -> None:
        from mutmut.mutation.file_mutation import create_mutations

        self.code = path.read_text() if code is None else code
        with contextlib.chdir(REPO):  # mutmut reads its settings from ./pyproject.toml
            self.module, mutations, _, _ = create_mutations(str(path), self.code)
        self.mutations = [m for m in mutations if m.contained_by_top_level_function is not None]

    def __len__(self) -> int:
        return len(self.mutations)

    def render(self, k: int) -> tuple[str, str]:
        """Mutant k: the mutated module and its changed line, before -> after."""
        import libcst as cst
        from mutmut.mutation.file_mutation import deep_replace

        m = self.mutations[k]
        tree = deep_replace(self.module, m.original_node, m.mutated_node)
        assert isinstance(tree, cst.Module)
        return tree.code, _change(self.code, tree.code)


def _change(before: str, after: str) -> str:
    old, new = before.splitlines(), after.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            gone = " / ".join(s.strip() for s in old[i1:i2]) or "(nothing)"
            came = " / ".join(s.strip() for s in new[j1:j2]) or "(nothing)"
            return f"{i1 + 1}: {gone[:150]}  ->  {came[:150]}"
    return "?"


def modules(packages: tuple[str, ...]) -> list[Path]:
    return [p for pkg in packages for p in sorted((REPO / pkg).rglob("*.py")) if "__pycache__" not in p.parts]


def sample(paths: list[Path], per_module: int, seed: int, at: str = "") -> tuple[list[Sampled], dict[Path, int]]:
    """`per_module` mutants of each module, drawn with `seed` (and the module's path, so one module's
    draw does not depend on which others are sampled); also each module's number of mutants. With `at`
    (a commit), the sample is drawn over the modules as they were at that commit and each mutant is
    carried to the module as it is now (`carried`); one that no longer applies is left out, and said."""
    chosen, population = [], {}
    for path in paths:
        every = Mutants(path, _source(path, at) if at else None)
        population[path] = len(every)
        picks = sorted(random.Random(f"{seed}:{path.relative_to(REPO)}").sample(range(len(every)), min(per_module, len(every))))
        for k in picks:
            text, change = every.render(k)
            if text == every.code:
                continue  # (a mutation that prints as the original: nothing to test)
            where = f"{path.relative_to(REPO / 'equivci')}:{change.split(':', 1)[0]}#{k}"
            if at:
                now = path.read_text() if path.exists() else ""
                text = carried(every.code, text, now) or ""
                if text in ("", now):
                    print(f"  {where} (drawn at {at}) no longer applies: {change[:120]}", flush=True)
                    continue
            chosen.append(Sampled(where, path, text, change))
    return chosen, population


def _source(path: Path, at: str) -> str:
    rel = path.relative_to(REPO).as_posix()
    return subprocess.run(["git", "show", f"{at}:{rel}"], cwd=REPO, check=True, capture_output=True, text=True).stdout


def _modules_at(packages: tuple[str, ...], at: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", at, *packages], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split()
    return [p for pkg in packages for p in sorted(REPO / f for f in listed if f.startswith(f"{pkg}/") and f.endswith(".py"))]


def carried(before: str, mutated: str, now: str, context: int = 3, widest: int = 8) -> str | None:
    """The mutation `before` -> `mutated` of a module applied to `now`, the module as it is now: each
    changed run of lines is replaced where the same lines, with `context` unchanged lines each side
    (as `patch` does, without fuzz) or as many more as make them occur once, occur in `now`. None when
    a run does not occur exactly once: the code the mutant changed, or next to it, has changed."""
    old, new = before.splitlines(keepends=True), mutated.splitlines(keepends=True)
    out = now.splitlines(keepends=True)
    hunks = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    for _, i1, i2, j1, j2 in reversed(hunks):
        for c in range(context, widest + 1):
            lo, hi = max(0, i1 - c), min(len(old), i2 + c)
            needle = old[lo:hi]
            hits = [k for k in range(len(out) - len(needle) + 1) if out[k:k + len(needle)] == needle]
            if len(hits) == 1:
                k = hits[0]
                out[k:k + len(needle)] = old[lo:i1] + new[j1:j2] + old[i2:hi]
                break
            if not hits or (lo == 0 and hi == len(old)):
                return None
        else:
            return None
    return "".join(out)


def interleaved(chosen: list[Sampled]) -> list[Sampled]:
    """The run order: each module's first mutant, then each one's second, ...: a budget that stops the
    run then shortens every module's sample alike instead of leaving out the last modules."""
    rank: dict[Path, int] = {}
    keyed = []
    for s in chosen:
        rank[s.path] = rank.get(s.path, -1) + 1
        keyed.append((rank[s.path], len(keyed), s))
    return [s for _, _, s in sorted(keyed, key=lambda t: t[:2])]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def stratified(rows: list[tuple[int, int, int]], z: float = 1.96) -> tuple[float, float, float]:
    """The kill rate over all the modules' mutants, from (population, killed, run) per module: each
    module's rate weighted by its number of mutants, with a normal 95 % interval (finite population)."""
    total = sum(n for n, _, r in rows if r)
    rate = sum(n * k / r for n, k, r in rows if r) / total
    var = sum((n / total) ** 2 * (k / r) * (1 - k / r) / max(r - 1, 1) * (1 - r / n) for n, k, r in rows if r)
    return rate, max(0.0, rate - z * math.sqrt(var)), min(1.0, rate + z * math.sqrt(var))


def recorded(path: Path, chosen: list[Sampled]) -> dict[str, tuple[str, str]]:
    """The outcomes (verdict, how) a results file holds for the drawn mutants, by name; a line whose
    change is not the drawn mutant's (its module has changed since) does not count."""
    if not path.exists():
        return {}
    changes = {s.name: s.change for s in chosen}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["name"]: (r["verdict"], r["how"]) for r in rows if changes.get(r["name"]) == r["change"]}


def record(path: Path, outcomes: list, of: dict[str, Sampled]) -> None:
    """Adds the outcomes to the results file; a mutant judged again replaces its line."""
    rows = {}
    if path.exists():
        rows = {(r := json.loads(line))["name"]: r for line in path.read_text().splitlines() if line.strip()}
    for o in outcomes:
        rows[o.mutant] = {"name": o.mutant, "change": of[o.mutant].change, "verdict": o.verdict, "how": o.how}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))


VERDICTS = ("killed by an assertion", "killed by an error", "survived", "timed out")


def classify(outcome) -> str:
    return {"killed": VERDICTS[0], "crashed": VERDICTS[1], "survived": VERDICTS[2], "timeout": VERDICTS[3]}[outcome.verdict]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-module", type=int, default=8, help="mutants drawn per module")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modules", default="", help="comma-separated files (default: every module of "
                        + ", ".join(VERDICT_PACKAGES) + ")")
    parser.add_argument("--exclude", default="", help="comma-separated files to leave out")
    parser.add_argument("--timeout", type=float, default=200, help="seconds per mutant (then it is a timeout)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=float, help="seconds for the whole run: then the mutants not run yet are "
                        "left out of the figures (they run round-robin over the modules: a budget shortens every module's sample)")
    parser.add_argument("--captures", type=Path, help="keep the near-miss captures in this file, for the next run")
    parser.add_argument("--only", default="", help="comma-separated names of drawn mutants (module:line#k) to run, "
                        "e.g. last run's survivors after new tests")
    parser.add_argument("--results", type=Path, help="a JSON-lines file of judged mutants, to resume a run: the drawn "
                        "mutants it holds are not run again (except those named by --only) and count in the figures; "
                        "the outcomes of this run are added to it")
    parser.add_argument("--drawn-at", default="", help="a commit: draw the sample over the modules as they were there "
                        "(a results file's sample), each mutant carried to the module as it is now; those that no longer "
                        "apply are said and left out")
    parser.add_argument("--past-errors", action="store_true", help="a check failing by an error (not an assertion) does "
                        "not stop a mutant's checks: they go on to the first assertion, so a mutant killed by an error "
                        "is one no check asserts against (slower: it runs every check, as a survivor does)")
    parser.add_argument("--list", action="store_true", help="print the sampled mutants and stop")
    args = parser.parse_args(argv)
    at = args.drawn_at
    paths = [REPO / m for m in args.modules.split(",") if m] or (_modules_at(VERDICT_PACKAGES, at) if at else modules(VERDICT_PACKAGES))
    paths = [p for p in paths if str(p.relative_to(REPO)) not in args.exclude.split(",")]
    t0 = time.perf_counter()
    drawn, population = sample(paths, args.per_module, args.seed, at)
    chosen = drawn
    if args.only:
        chosen = [s for s in drawn if s.name in args.only.split(",")]
        unknown = set(args.only.split(",")) - {s.name for s in chosen}
        if unknown:
            parser.error(f"--only: {', '.join(sorted(unknown))} not among the drawn mutants (same --seed and --per-module?)")
    print(f"{len(chosen)} mutants sampled (seed {args.seed}, {args.per_module} per module) of "
          f"{sum(population.values())} in {len(paths)} modules" + (f" as they were at {at}" if at else ""), flush=True)
    if args.list:
        for s in chosen:
            print(f"{s.name:34s} {s.change}")
        return 0
    of = {s.name: s for s in drawn}
    earlier = recorded(args.results, drawn) if args.results else {}
    if args.results:
        if not args.only:
            chosen = [s for s in drawn if s.name not in earlier]
        print(f"{args.results}: {len(earlier)} of the drawn mutants judged before; {len(chosen)} to run", flush=True)
    outcomes = run_sample(args, chosen) if chosen else []
    if outcomes is None:
        return 1
    if args.results:
        record(args.results, outcomes, of)
        again = {o.mutant for o in outcomes}
        outcomes = [_harness().Outcome(n, *earlier[n]) for n in earlier if n not in again] + outcomes
    report(outcomes, of, paths, population)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


def run_sample(args: argparse.Namespace, chosen: list[Sampled]) -> list | None:
    """The outcomes of the chosen mutants (those the budget reached), or None when the unmutated
    package fails its own checks."""
    vm = _harness()
    sys.path.insert(0, str(vm.SOUNDNESS))
    from near_miss_cases import DEFAULT

    # -x: a pytest check stops at its first failure, except with --past-errors, where an error in one
    # test must not hide an assertion of a later test of the same check
    x = "" if args.past_errors else " -x"
    checks = tuple(f"model:{n}" for n in sorted(DEFAULT)) + tuple(f"pytest:{t}{x}" for t in TESTS)

    def own(s: Sampled) -> tuple[str, ...]:
        return tuple(f"pytest:{t}{x}" for t in MODULE_TESTS.get(str(s.path.relative_to(REPO)), ()))

    edits = [vm.Edit(s.name, (s.path, s.text), own(s) + checks) for s in interleaved(chosen)]
    baseline_checks = checks + tuple(dict.fromkeys(k for s in chosen for k in own(s)))
    with tempfile.TemporaryDirectory(prefix="mutation-tool-") as tmp:
        captures = args.captures or Path(tmp) / "captures.pkl"
        baseline, outcomes = vm.run_edits(edits, baseline_checks, Path(tmp), captures, args.workers, args.timeout,
                                          first=not args.past_errors,
                                          budget=args.budget, log=lambda line: print(line, flush=True))
    if baseline.verdict != "survived":
        print(f"the unmutated package fails its own checks ({baseline.verdict}: {baseline.how}); no figures")
        return None
    return outcomes


def report(outcomes: list, of: dict[str, Sampled], paths: list[Path], population: dict[Path, int]) -> None:
    if not outcomes:
        print("no mutant judged (a --budget too small for one?)")
        return
    by_module: dict[Path, dict[str, int]] = {p: dict.fromkeys(VERDICTS, 0) for p in paths}
    for o in outcomes:
        s = of[o.mutant]
        by_module[s.path][classify(o)] += 1
        if o.verdict != "killed":
            print(f"  {classify(o):22s} {s.name}: {s.change}")
    print("\nper module: killed (assertion + error) / run, of the module's mutants")
    for p, c in by_module.items():
        print(f"  {str(p.relative_to(REPO)):40s} {c[VERDICTS[0]] + c[VERDICTS[1]]:3d} / {sum(c.values()):3d} of {population[p]}")
    counts = {v: sum(c[v] for c in by_module.values()) for v in VERDICTS}
    killed, total = counts[VERDICTS[0]] + counts[VERDICTS[1]], len(outcomes)
    lo, hi = wilson(killed, total)
    print(f"\n{total} mutants: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    print(f"kill rate {100 * killed / total:.1f} % (95 % CI {100 * lo:.1f}-{100 * hi:.1f} %, Wilson; a timeout counts "
          f"as not killed); by an assertion alone {100 * counts[VERDICTS[0]] / total:.1f} %")
    rate, slo, shi = stratified([(population[p], c[VERDICTS[0]] + c[VERDICTS[1]], sum(c.values()))
                                 for p, c in by_module.items()])
    print(f"weighted by each module's number of mutants: {100 * rate:.1f} % (95 % CI {100 * slo:.1f}-{100 * shi:.1f} %)")


if __name__ == "__main__":
    sys.exit(main())
