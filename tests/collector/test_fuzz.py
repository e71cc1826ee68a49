"""The decoder's fuzzer, kept in the project (bench/fuzz, `make fuzz`): built with Debian's clang under
AddressSanitizer + UndefinedBehaviorSanitizer, it runs the project's corpus clean and a short
coverage-guided run (native, then with the differential check against the Python decoder on every
input) finds nothing. In CI (`CI=true`) a missing clang is a failure, not a skip (`make test` installs
it: the Makefile's `clang` prerequisite)."""

from __future__ import annotations

import json
import sys

import pytest

from _native import REPO, require_clang, require_fast_path

sys.path.insert(0, str(REPO / "bench" / "fuzz"))
import run  # noqa: E402

CORPUS = REPO / "tests" / "collector" / "corpus"


@pytest.fixture(scope="module")
def binaries():
    require_fast_path()
    require_clang()
    return run.build()


def test_the_sanitized_decoder_runs_the_corpus_clean(binaries):
    """missing-keys-memcmp.bin passed NULL to memcmp in keys_add (UBSan: undefined behaviour); an empty
    key's NULL pointer also met `+ 0` in json_str. Each corpus file, and the seeds, run clean now."""
    inputs = sorted(map(str, CORPUS.glob("*.bin")))
    assert len(inputs) == 4
    for kind in ("native", "diff"):
        done = run.run_fresh([str(binaries[kind]), "-timeout=20", *inputs], env=run._env(kind), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stderr.count("Executed ") == 4, done.stderr[-2000:]


@pytest.mark.timeout(300)
def test_a_short_coverage_guided_run_finds_nothing(binaries):
    """`run.py --quick`: 15 s native + 15 s differential from the seeds (about a minute with the build)."""
    assert run.main(["--quick"]) == 0
    summary = json.loads((run.BUILD / "last-quick-run.json").read_text())
    native, diff = summary["runs"]
    assert native["executions"] > 2000 and diff["executions"] > 200, summary
    assert summary["corpus"] > summary["seeds"] // 2, summary  # libFuzzer ran coverage-guided and kept inputs
