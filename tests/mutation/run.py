"""Mutation testing of the core math with cosmic-ray (``make mutation``; not in CI: 5-25 min a module on 2
loaded cores). Each target mutates one module and runs only the tests that cover it; the score must reach
``MIN_KILLED`` of the mutants. grpo.py's target mutates only the loss plumbing (``REGIONS``: cosmic-ray's line
filter over the named functions) and runs the fast ``test_grpo_loss.py``. Mutants are made in a scratch copy of
the committed tree (``mutation-results/tree``, ``git archive HEAD``, imported first through PYTHONPATH), never in
the checkout: commit new tests before a run.

    .venv/bin/python tests/mutation/run.py [--retest-survivors] [credit|decomposer|grpo ...]

``--retest-survivors`` refreshes the copy and runs again only the mutants that survived last time (after
adding tests that should kill them).

Operators: cosmic-ray's core set, with binary and comparison replacements cut to the informative ones
(``+``/``-``, ``*``/``/``, ``**`` -> ``*``, ``//`` -> ``/``, ``%`` -> ``//``; ``==``/``!=``, ``<``/``<=``,
``>``/``>=``, ``is``/``is not``, ``in``/``not in``): the other eleven replacements of each operator (bit
shifts, ``|``, ``^`` ... on floats) only multiply the count (credit.py: 1191 mutants, 340 after the cut).
Sessions and reports go to ``mutation-results/`` (git-ignored); survivors are listed with their diffs.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "mutation-results"
MIN_KILLED = 0.85
TREE = OUT / "tree"
# no plugin autoload: 0.7 s of CPU a run instead of 2.6 s (test_credit.py); no bytecode, so a mutant of the
# same size written in the same second as the last can never run from a stale .pyc
_PYTEST = (f"env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={TREE} "
           f"{sys.executable} -m pytest -x -q -p no:cacheprovider")

_DECOMPOSER_TESTS = (f"{_PYTEST} tests/store/test_decomposer.py tests/store/test_decomposer_walk.py "
                     f"tests/store/test_decomposer_parts.py "
                     f"tests/store/test_kept_rollouts.py")
TARGETS: dict[str, tuple[str, str]] = {
    "credit": ("algorithms/credit.py",
               f"{_PYTEST} --noconftest tests/algorithms/test_credit.py tests/algorithms/test_credit_gigpo.py"),
    # the decomposer's Python (its SQL text is decomposer.sql), run through the kept-rows path by default
    "decomposer": ("store/decomposer.py", _DECOMPOSER_TESTS),
    "grpo": ("algorithms/grpo.py", f"{_PYTEST} tests/algorithms/test_grpo_loss.py"),
}
"""Name -> (module to mutate, the test command that must fail on each mutant)."""

REGIONS: dict[str, tuple[str, ...]] = {
    # the loss plumbing: what goes into TRL's loss and what comes out; not validate/setup/checkpoints (config
    # and I/O, test_grpo.py's ~13 s of CPU a mutant) nor the log-prob forwards (spanrl.algorithms.batching's)
    "grpo": ("update", "_trl_inputs", "_processes_per_rank", "_optimizer_step", "_metrics", "_approx_kl"),
}
"""Name -> the functions whose lines alone are mutated (cosmic-ray's line filter); absent: the whole module."""

_KEEP_BINARY = "Add_Sub|Sub_Add|Mul_Div|Div_Mul|Pow_Mul|FloorDiv_Div|Mod_FloorDiv|MatMult_Mul"
_KEEP_COMPARE = "Eq_NotEq|NotEq_Eq|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Is_IsNot|IsNot_Is|In_NotIn|NotIn_In"
_EXCLUDE = [f"core/ReplaceBinaryOperator_(?!({_KEEP_BINARY})$).*",
            f"core/ReplaceComparisonOperator_(?!({_KEEP_COMPARE})$).*"]


def _config(module: str, command: str, functions: tuple[str, ...] = ()) -> str:
    excluded = ", ".join(f'"{p}"' for p in _EXCLUDE)
    config = (f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = 120.0\nexcluded-modules = []\n'
              f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n\n'
              f'[cosmic-ray.filters.operators-filter]\nexclude-operators = [{excluded}]\n')
    if functions:
        lines = ", ".join(f'"{a}-{b}"' for a, b in _function_lines(TREE / module, functions))
        config += f'\n[cosmic-ray.filters.line-filter]\nlines = {{ "{module}" = [{lines}] }}\n'
    return config


def _function_lines(path: Path, functions: tuple[str, ...]) -> list[tuple[int, int]]:
    """(first, last) line of each named function or method of ``path``; all must exist."""
    import ast

    found = {n.name: (n.lineno, n.end_lineno) for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in functions}
    missing = sorted(set(functions) - set(found))
    if missing:
        raise SystemExit(f"{path}: no function {missing}")
    return [found[name] for name in functions]


def score(session: Path) -> tuple[int, int, list[str]]:
    """(killed, completed, survivor descriptions) of a cosmic-ray session."""
    con = sqlite3.connect(session)
    rows = con.execute(
        "SELECT s.module_path, s.operator_name, s.start_pos_row, r.test_outcome, r.diff FROM work_results r "
        "JOIN mutation_specs s ON s.job_id = r.job_id WHERE r.worker_outcome = 'NORMAL'").fetchall()
    survived = [f"{m}:{row} {op}\n{diff}" for m, op, row, outcome, diff in rows if outcome == "SURVIVED"]
    return len(rows) - len(survived), len(rows), survived


def make_tree() -> None:
    """The committed tree in TREE, with ``spanrl/<sub>`` links to the package folders (pyproject's
    package-dir), so that PYTHONPATH=TREE imports every ``spanrl.*`` module from the copy."""
    import shutil
    import tomllib

    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", TREE], input=archive, check=True)
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in dirs.items():
        parts = package.split(".")
        if len(parts) == 2:  # spanrl.<sub> -> <folder>; deeper ones live inside their parent's folder
            (TREE / "spanrl" / parts[1]).symlink_to(TREE / folder, target_is_directory=True)
    for built in REPO.glob("collector/*.so"):  # the C decoder, if built here (not in git)
        shutil.copy(built, TREE / "collector")


def run(name: str, *, retest_survivors: bool = False) -> bool:
    module, command = TARGETS[name]
    config, session = OUT / f"{name}.toml", OUT / f"{name}.sqlite"
    functions = REGIONS.get(name, ())
    config.write_text(_config(module, command, functions))
    bin_dir = Path(sys.executable).parent
    if not session.exists():  # a session is resumable: exec runs only the mutants not done yet
        subprocess.run([bin_dir / "cosmic-ray", "init", config, session], cwd=TREE, check=True)
        subprocess.run([bin_dir / "cr-filter-operators", session, config], cwd=TREE, check=True)
        if functions:
            subprocess.run([bin_dir / "cr-filter-lines", session, "--config", config], cwd=TREE, check=True)
    elif retest_survivors:
        with sqlite3.connect(session) as con:
            con.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
    subprocess.run([bin_dir / "cosmic-ray", "exec", config, session], cwd=TREE, check=True)
    killed, done, survivors = score(session)
    (OUT / f"{name}-survivors.txt").write_text("\n".join(survivors))
    rate = killed / done if done else 0.0
    print(f"{name}: {killed}/{done} mutants killed ({rate:.1%}); survivors in {OUT / (name + '-survivors.txt')}")
    return rate >= MIN_KILLED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"some of {sorted(TARGETS)} (default: all)")
    parser.add_argument("--retest-survivors", action="store_true", help="run only last time's survivors again")
    args = parser.parse_args(argv)
    names = args.targets or list(TARGETS)
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"targets must be among {sorted(TARGETS)}, got {unknown}")
    OUT.mkdir(exist_ok=True)
    make_tree()
    ok = [run(name, retest_survivors=args.retest_survivors) for name in names]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
