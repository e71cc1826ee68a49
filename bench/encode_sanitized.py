"""The agent's C span encoder (instrumentation/_encode.c) under gcc's AddressSanitizer + UndefinedBehavior
Sanitizer: built into a temporary folder, loaded in place of the installed one, fed the suite's random spans
(tests/instrumentation/test_span_exporter.py's generator: every attribute type, 20,000-character strings
past the encoder's stack buffer, remote parents, trace states; each span again with plain-dict attributes,
lists and empty ones) and odd tuples, each output compared byte for
byte with the Python encoder. A sanitizer report aborts the run (exit status not 0).

    .venv/bin/python bench/encode_sanitized.py [--seeds 30] [--spans 200]

Measured 2026-12-06: 14,384 spans, clean, in 3 s. The suite runs it with 5 seeds (test_span_exporter.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHECK = textwrap.dedent(
    """
    import importlib.util, logging, sys
    logging.disable(logging.WARNING)  # the SDK's 'attributes dict is full' on the generator's limited spans
    spec = importlib.util.spec_from_file_location("spanrl.instrumentation._encode", sys.argv[1])
    sanitized = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanitized)
    from spanrl.instrumentation import exporter
    exporter._encode = sanitized
    sys.path[:0] = [{tests!r}, {tests!r} + "/instrumentation"]
    import test_span_exporter as generator
    import random
    n = 0
    for seed in range(int(sys.argv[2])):
        spans = generator._random_spans(seed, int(sys.argv[3]))
        rng = random.Random(seed)
        for span in spans + [generator._with_plain_attributes(span, rng) for span in spans]:
            snap = exporter.snapshot(span)
            assert sanitized.encode_snapshot(snap) == exporter._encode_snapshot(snap)[2], span.name
            n += 1
    for span in generator._varied_spans() + generator._limited_spans():
        sanitized.encode_snapshot(exporter.snapshot(span))
    for odd in [(), ("a",) * 18, (None,) * 40, tuple(range(19)), (b"", b"", 2**200, 1) + (None,) * 14]:
        assert sanitized.encode_snapshot(odd) is None
    print(f"{{n}} spans byte for byte equal to the Python encoder under ASan + UBSan")
    """
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=30, help="random span sets")
    parser.add_argument("--spans", type=int, default=200, help="spans per set (plus their children)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "_encode_sanitized.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined",
                        "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-std=c11", "-Wall", "-Wextra",
                        "-Wno-missing-field-initializers", "-I" + sysconfig.get_paths()["include"],
                        str(ROOT / "instrumentation" / "_encode.c"), "-o", str(built)], check=True)
        runtime = [subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True,
                                  check=True).stdout.strip() for lib in ("libasan.so", "libubsan.so")]
        env = {**os.environ, "LD_PRELOAD": ":".join(runtime), "ASAN_OPTIONS": "detect_leaks=0",
               "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
        code = _CHECK.format(tests=str(ROOT / "tests"))
        return subprocess.run([sys.executable, "-c", code, str(built), str(args.seeds), str(args.spans)],
                              env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
