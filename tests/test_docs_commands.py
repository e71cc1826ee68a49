"""Every command block in the README and the examples' READMEs either runs here or says why not.

The marking convention, on the line right before a fence:

    <!-- run: quick -->                    the block runs here, as written
    <!-- run: quick "OLD" => "NEW" -->     ... after these substitutions (its quick setting, e.g. fewer steps)
    <!-- not run: REASON -->               it does not; the reason names the test that covers it, if one does
    <!-- file: NAME -->                    the block (any language) is a file the runnable blocks use
    <!-- file: NAME "OLD" => "NEW" -->     ... written with these substitutions
    <!-- expect: REGEX -->                 after the document's blocks ran, their output matches REGEX

A shell block (bash, sh, shell, console) with neither ``run`` nor ``not run`` fails the marking test, and so
does any other code block with no marker. A
document's runnable blocks run in order as one bash script (``set -e``) in a temp folder outside the
checkout (holding a link to ``examples/`` for the walkthroughs run from a checkout), its ``file`` blocks
written there in their place, with the venv's ``bin`` on PATH and the
default ports (4317, 4318, 8000) replaced by free ones; background jobs (``&``) are killed at the end.
Documents that say "from an installed spanrl" run against the wheel (the fixture of
``tests/demo/test_demo_from_wheel.py``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "examples" / "README.md", *sorted(REPO.glob("examples/*/README.md"))]
SHELL = {"bash", "sh", "shell", "console"}
_SUBS = r"( \"[^\"]*\" => \"[^\"]*\",?)*"
_MARK = re.compile(rf"^<!-- (run: quick(?P<subs>{_SUBS})|not run: (?P<why>.+\S)|"
                   rf"file: (?P<file>[\w./-]+)(?P<fsubs>{_SUBS})) -->$")
_SUB = re.compile(r"\"([^\"]*)\" => \"([^\"]*)\"")
_FENCE = re.compile(r"^```(\w*)\s*$")
_DEFAULT_PORTS = (4317, 4318, 8000)
_SCRIPT_TIMEOUT_S = 600


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    text: str
    mark: re.Match[str] | None

    @property
    def where(self) -> str:
        return f"{_name(self.doc)}:{self.line}"


def _name(doc: Path) -> str:
    return str(doc.relative_to(REPO)) if doc.is_relative_to(REPO) else doc.name


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` with the marker right before each (None: no marker)."""
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found.append(Block(doc, i + 1, opened.group(1), "\n".join(lines[i + 1:end]) + "\n", _MARK.match(before)))
        i = end + 1
    return found


def _runnable_docs() -> list[Path]:
    return [doc for doc in DOCS if any(b.mark and b.mark.group(0).startswith("<!-- run") for b in blocks(doc))]


def test_every_shell_block_is_marked() -> None:
    unmarked = [b.where for doc in DOCS for b in blocks(doc)
                if b.lang in SHELL and not (b.mark and not b.mark.group("file"))]
    assert unmarked == [], "shell blocks with neither <!-- run: quick --> nor <!-- not run: why -->"


def test_every_other_code_block_is_run_or_says_why() -> None:
    """Code (Python, YAML, a diagram): a file the runnable blocks use, or a reason it is not run."""
    unmarked = [b.where for doc in DOCS for b in blocks(doc) if b.lang not in SHELL and not b.mark]
    assert unmarked == [], "code blocks with neither <!-- file: NAME --> nor <!-- not run: why -->"


def test_the_marks_parse() -> None:
    """A marker names a rule the test knows: a misspelt one is not silently skipped."""
    bad = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("<!-- ") and re.match(r"<!-- (run|not run|file)\b", line) and not _MARK.match(line):
                bad.append(f"{doc.relative_to(REPO)}:{number}: {line}")
    assert bad == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def script(doc: Path, ports: dict[int, int]) -> str:
    """The document's runnable blocks as one bash script, files written in their place."""
    parts = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for block in blocks(doc):
        if not block.mark or block.mark.group("why"):
            continue
        text = block.text
        for old, new in _SUB.findall(block.mark.group("subs") or block.mark.group("fsubs") or ""):
            assert old in text, f"{block.where}: the quick setting replaces {old!r}, which the block lacks"
            text = text.replace(old, new)
        for default, port in ports.items():
            text = re.sub(rf"(?<=:){default}\b|(?<=port ){default}\b", str(port), text)
        if block.mark.group("file"):
            parts.append(f"cat > {block.mark.group('file')} <<'SPANRL_DOC_EOF'\n{text}SPANRL_DOC_EOF")
            continue
        parts.append(f"echo '>>> {block.where}'\n{text}")
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "tests" / "demo"))
    try:
        from test_demo_from_wheel import _build_and_install
    finally:
        sys.path.remove(str(REPO / "tests" / "demo"))
    return _build_and_install(tmp_path_factory.mktemp("wheel"))


def _environ(ports: dict[int, int], site: Path | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SPANRL_", "OTEL_", "OPENAI_"))}
    environ.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "SPANRL_COLLECTOR_GRPC_PORT": str(ports[4317]), "SPANRL_COLLECTOR_HTTP_PORT": str(ports[4318]),
        "SPANRL_SQL_URL": f"http://127.0.0.1:{ports[4318]}",
        "SPANRL_POLICY_URL": f"http://127.0.0.1:{ports[8000]}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports[4317]}",
    })
    if site is not None:
        environ["PYTHONPATH"] = str(site)
    return environ


def run_doc(doc: Path, folder: Path, site: Path | None) -> tuple[int, str]:
    """Run ``doc``'s runnable blocks in ``folder``: (exit status, everything they printed)."""
    ports = {default: _free_port() for default in _DEFAULT_PORTS}
    folder.mkdir(parents=True, exist_ok=True)
    if site is None:  # a walkthrough "from the root of your checkout": its examples, nothing else of it
        (folder / "examples").symlink_to(REPO / "examples")
    else:
        where = subprocess.run([sys.executable, "-c", "import spanrl.trainer; print(spanrl.trainer.__file__)"],
                               cwd=folder, env=_environ(ports, site), capture_output=True, text=True, check=True)
        assert where.stdout.startswith(str(site)), f"spanrl came from {where.stdout}, not the wheel"
    (folder / "doc.sh").write_text(script(doc, ports))
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "doc.sh"], cwd=folder, env=_environ(ports, site), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=_SCRIPT_TIMEOUT_S)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this test started: servers left behind
            except ProcessLookupError:
                pass
    return rc, log.read_text()


def check(doc: Path, rc: int, shown: str) -> None:
    """What the reader was promised: the commands succeed, no traceback, every ``expect`` line seen."""
    assert rc == 0, f"{_name(doc)}'s commands failed:\n{shown[-6000:]}"
    assert "Traceback" not in shown, shown[-6000:]
    for expected in re.findall(r"<!-- expect: (.+?) -->", doc.read_text()):
        assert re.search(expected, shown, re.MULTILINE), f"{expected!r} not in the output:\n{shown[-6000:]}"


def test_the_runner_fails_what_a_reader_would_see_fail(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text('<!-- file: conf.txt "SLOW" => "QUICK" -->\n```\nSLOW http://127.0.0.1:8000\n```\n\n'
                   "<!-- run: quick -->\n```bash\ncat conf.txt\necho port 4318 spanrl sql\n```\n"
                   "<!-- expect: ^QUICK http://127.0.0.1:\\d+$ -->\n")
    rc, shown = run_doc(doc, tmp_path / "ok", None)
    check(doc, rc, shown)
    assert ":8000" not in shown and "port 4318" not in shown  # the defaults became free ports
    doc.write_text(doc.read_text() + "<!-- expect: never printed -->\n")
    with pytest.raises(AssertionError, match="never printed"):
        check(doc, *run_doc(doc, tmp_path / "unseen", None))
    doc.write_text("<!-- run: quick -->\n```bash\nfalse\necho after\n```\n")
    rc, shown = run_doc(doc, tmp_path / "failing", None)
    assert rc != 0 and "after" not in shown  # set -e: the first failing command stops the walkthrough


@pytest.mark.parametrize("doc", _runnable_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_runnable_blocks_run(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    site = request.getfixturevalue("wheel_site") if "from an installed spanrl" in doc.read_text() else None
    check(doc, *run_doc(doc, tmp_path / "user", site))
