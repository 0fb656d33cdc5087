"""Every shell example in docs/*.md runs as written (docs/ is Markdown a user can follow as written; every
example in it is run by a test; the ```python blocks are run by tests/test_docs.py).

Each block is run line by line through bash, in a temporary directory, with `bide`, `bide-audit`, `govern`,
`python` and `python3` on the PATH as this checkout's commands (wrappers running this interpreter, as the
console scripts would); nothing in a line is changed, except a path a reader has that a test cannot (the
checkout's own path in protocols.md, `/mnt/anchor` in audit.md). Where a block names what the reader
already has (a store with a halted run `charge-2`, approvers' keys, an app module `myapp.agents`), the test
makes exactly that first, in the temporary directory. Every line must exit as the doc says (0 unless it
says otherwise), and where a console block shows output, the output must match it, "…" and "..." standing
for elided text (whitespace is compared as one space, since the terminal's width wraps paragraphs).

`test_every_shell_block_is_run_by_a_test` fails when a doc gains a shell block that no test here runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import bide
from bide.audit import generate_key
from bide.testing import Fail, ScriptedModel, Turn, call

pytestmark = pytest.mark.slow  # each test runs its block's commands as processes

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_SHELL = re.compile(r"^```(?:sh|console|bash|shell)[^\n]*\n(.*?)^```", re.S | re.M)

#: Every shell block of docs/, by file and position among that file's shell blocks: the start of its first
#: command (so that a test cannot run the wrong block after one is added or moved).
SHELL_BLOCKS: dict[tuple[str, int], str] = {
    ("audit.md", 0): "bide-audit keygen log.key",
    ("benchmarks.md", 0): "pip install -e '.[test]'",
    ("benchmarks.md", 1): "pip install -e '.[peers]'",
    ("benchmarks.md", 2): "python benchmarks/crash/run.py --trials 50 --overhead-runs 100",
    ("benchmarks.md", 3): "python benchmarks/crash/run.py --trials 50 --overhead-runs 100",
    ("benchmarks.md", 4): "python benchmarks/crash/run.py --trials 50 --overhead-runs 150",
    ("certificate.md", 0): "govern keygen ci-key",
    ("certificate.md", 1): "govern check dist/orders.govern-cert.json",
    ("certificate.md", 2): "govern certify machines/orders.py",
    ("certificate.md", 3): "govern certify limits.py",
    ("certificate.md", 4): "python3 -m govern certify examples/orders.py",
    ("cli.md", 0): "bide runs --store sqlite:///bide.db",
    ("operations.md", 0): "bide worker --store sqlite:///bide.db --app myapp.agents:build",
    ("protocols.md", 0): 'cd "$(mktemp -d)" && spin -a /path/to/bide/tests/protocols/claim.pml',
}

#: How long a test waits for a background command (a worker that runs until a signal) to have done its
#: work before failing: a bound against hanging, not a speed requirement.
PATIENCE = 120.0


# --- reading the blocks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One command of a block and the output the doc shows under it (None when it shows none)."""

    command: str
    shown: str | None


def _shell_blocks(doc: str) -> list[str]:
    return _SHELL.findall((DOCS / doc).read_text())


def _is_console(doc: str, index: int) -> bool:
    fences: list[str] = re.findall(r"^```(sh|console|bash|shell)", (DOCS / doc).read_text(), re.M)
    return fences[index] == "console"


def examples(doc: str, index: int) -> list[Example]:
    """The commands of shell block `index` of docs/`doc`, checked against `SHELL_BLOCKS`. A console block's
    commands are its `$ ` lines, each followed by the output it shows; an sh block's are its lines that are
    not comments, with `\\` continuations joined. Comments after a command stay: bash ignores them."""
    body = _shell_blocks(doc)[index]
    found: list[Example] = []
    if _is_console(doc, index):
        command: str | None = None
        shown: list[str] = []
        for line in [*body.splitlines(), "$ "]:
            if line.startswith("$ "):
                if command is not None:
                    text = "\n".join(shown).strip("\n")
                    found.append(Example(command, text or None))
                command, shown = line[2:], []
            else:
                shown.append(line)
    else:
        joined = re.sub(r"\\\n", " ", body)
        found = [
            Example(line, None) for line in joined.splitlines() if line.strip() and not line.startswith("#")
        ]
    assert found and found[0].command.startswith(SHELL_BLOCKS[(doc, index)]), (doc, index, found[:1])
    return found


def commands(doc: str, index: int) -> list[str]:
    return [e.command for e in examples(doc, index)]


def _flat(text: str) -> str:
    return " ".join(text.split())


def assert_shows(shown: str, output: str) -> None:
    """`output` is what the doc shows: the same words in the same order, whitespace compared as one space,
    each "…" or "..." of the doc standing for any text."""
    texts = re.split(r"…|\.\.\.", _flat(shown))
    pieces = [re.escape(text) for text in texts]
    printed = _flat(output)
    if re.fullmatch(".*?".join(pieces), printed, re.S):
        return
    agree = max(n for n in range(len(pieces) + 1) if re.match(".*?".join(pieces[:n]), printed, re.S))
    differs = texts[min(agree, len(texts) - 1)]
    raise AssertionError(f"the output differs from the doc at {differs!r}:\n{output}")


# --- running them ---------------------------------------------------------------------------------------


_COMMANDS = {"bide": "-m bide._cli", "bide-audit": "-m bide.audit._cli", "govern": "-m govern"}


@dataclass
class Shell:
    """bash in `cwd`, with this checkout's `bide`, `bide-audit`, `govern`, `python` and `python3` first on
    the PATH, this checkout first on PYTHONPATH, and no $BIDE_STORE (the commands' defaults apply)."""

    cwd: Path
    env: dict[str, str]

    def run(self, line: str, *, code: int = 0) -> subprocess.CompletedProcess[str]:
        """Run one line; it must exit with `code`."""
        done = subprocess.run(
            ["bash", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == code, (line, done.returncode, done.stdout[-3000:], done.stderr[-3000:])
        return done

    @contextlib.contextmanager
    def background(self, line: str) -> Iterator[Background]:
        """Start one line that runs until it is signalled (its own process group, output to files); killed
        on the way out if the test left it running."""
        logs = self.cwd / f".background-{time.monotonic_ns()}"
        with open(f"{logs}.out", "w") as out, open(f"{logs}.err", "w") as err:
            proc = subprocess.Popen(
                ["bash", "-c", line],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        running = Background(line, proc, Path(f"{logs}.out"), Path(f"{logs}.err"))
        try:
            yield running
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class Background:
    """A line started by `Shell.background`, and the files its output goes to."""

    line: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def logs(self) -> str:
        return (
            f"{self.line}\nstdout:\n{self.out.read_text()[-3000:]}\nstderr:\n{self.err.read_text()[-3000:]}"
        )

    def alive(self) -> None:
        assert self.proc.poll() is None, "exited early, " + self.logs()

    def stop(self, sig: signal.Signals) -> int:
        """Send `sig` to the line's processes; its exit code once it ended."""
        os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout=PATIENCE)


def shell(cwd: Path) -> Shell:
    bin_dir = cwd / ".bin"
    bin_dir.mkdir()
    python = shlex.quote(sys.executable)
    wrappers = {name: f"{python} {args}" for name, args in _COMMANDS.items()}
    wrappers |= {"python": python, "python3": python}
    for name, target in wrappers.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "BIDE_STORE"}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["TMPDIR"] = str(cwd)  # `mktemp -d` in a block stays inside the test's directory
    return Shell(cwd, env)


def write_app(where: Path, source: str) -> ModuleType:
    """Write `source` as `myapp/agents.py` under `where` (what `--app myapp.agents:build` imports) and load
    it here too, under a private name (sys.modules is left alone), for the test to start runs with."""
    package = where / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text(source)
    spec = importlib.util.spec_from_file_location(
        f"_docs_shell_app_{time.monotonic_ns()}", package / "agents.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def sqlite_store(where: Path) -> Iterator[bide.Store]:
    """The store the commands call `sqlite:///bide.db` when run in `where`."""
    store = bide.open_store(f"sqlite:///{where / 'bide.db'}")
    try:
        yield store
    finally:
        store.close()


def statuses(where: Path, runs: list[str]) -> dict[str, str]:
    with sqlite_store(where) as store:
        return {run: bide.run_status(store, run).status for run in runs}


def wait_until_completed(where: Path, runs: list[str], worker: Background) -> None:
    """Wait until every run in `runs` has completed, the worker still running."""
    give_up = time.monotonic() + PATIENCE
    while (now := statuses(where, runs)) != dict.fromkeys(runs, "completed"):
        worker.alive()
        assert time.monotonic() < give_up, (now, worker.logs())
        time.sleep(0.2)


def crash(store: bide.Store, app: ModuleType, agent: str, run: str, message: str, first: Turn) -> None:
    """Start `run` with a model whose first turn is `first` and whose second fails: the drive ends with the
    run unfinished and its lease not live, as when its process died."""
    model = ScriptedModel([first, Fail(bide.ModelError("503 from the model"))])
    with contextlib.suppress(bide.ModelError):
        bide.Agent(model, store=store, tools=app.TOOLS, name=agent).run_sync(run, message)
    assert bide.run_status(store, run).status == "running"


# --- docs/cli.md ------------------------------------------------------------------------------------------

CLI_APP = '''"""The agents of docs/cli.md's examples: `bide worker --app myapp.agents:build`."""
import bide
from bide.approvals import ApprovalGate
from bide.testing import ScriptedModel, call, reply

FIRST_CALL = {"order-1": "look_up", "charge-2": "charge", "ship-3": "ship"}


@bide.tool(safety=bide.ReadOnly)
def look_up(order: str) -> str:
    """Look an order up."""
    return f"{order}: paid"


@bide.tool(timeout=30)
def charge(order: str) -> str:
    """Charge the card: the connection drops after the request went out, so nobody knows if it did."""
    raise OSError("connection lost after the request went out")


TOOLS = [look_up, charge]


def first_call(request):
    return call(FIRST_CALL[request.run_id], order=request.run_id)


def model():
    return ScriptedModel([first_call, reply("done")])


def build(store):
    @bide.tool(gate=ApprovalGate.single("alice", "alice.key.pub"))
    def ship(order: str) -> str:
        """Ship an order (alice approves)."""
        return f"{order} shipped"

    return bide.Agent(model(), store=store, tools=[*TOOLS, ship], name="orders")
'''


def test_cli_operating_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md's `bide` commands, in order, against what they name: a run `order-1` whose driver died,
    `charge-2` halted on a side effect (resolved by the `resolve` line), `ship-3` waiting for alice's
    approval (started once `bide keygen alice.key` has made her seat) and the app `myapp.agents:build`.
    Each line exits 0 and does what its comment says; the worker, which runs until a signal, completes the
    three runs and exits 0 on SIGTERM."""
    sh = shell(tmp_path)
    app = write_app(tmp_path, CLI_APP)
    monkeypatch.chdir(tmp_path)
    with sqlite_store(tmp_path) as store:
        crash(store, app, "orders", "order-1", "Where is order-1?", call("look_up", order="order-1"))
        # The charge's driver runs a minute behind: the deadline its attempt marker records has passed
        # already when `bide resolve` comes (it accepts an outcome past the deadline and the 1 s clock-skew
        # margin), while the call had all its 30 s to start (a short timeout, waited out, could leave the
        # call unstarted on a loaded machine: ToolNotStarted, not a halt).
        behind = bide.Agent(
            app.model(), store=store, tools=app.TOOLS, name="orders", clock=lambda: time.time() - 60
        )
        with contextlib.suppress(bide.OutcomeUnknown):
            behind.run_sync("charge-2", "Charge it")
        assert bide.run_status(store, "charge-2").status == "halted"

    by_command: dict[str, subprocess.CompletedProcess[str]] = {}
    for line in commands("cli.md", 0):
        if line.startswith("bide worker"):
            with sh.background(line) as worker:
                wait_until_completed(tmp_path, ["order-1", "charge-2", "ship-3"], worker)
                assert worker.stop(signal.SIGTERM) == 0, worker.logs()
            continue
        by_command[line.split("#")[0].strip()] = sh.run(line)
        if line.startswith("bide keygen alice.key"):
            with sqlite_store(tmp_path) as store, contextlib.suppress(bide.ApprovalPending):
                app.build(store).run_sync("ship-3", "Ship it")  # alice.key.pub is her seat

    every = by_command["bide runs --store sqlite:///bide.db"].stdout
    assert "order-1" in every and "halted at c0.0 (charge)" in every
    for_a_person = by_command["bide runs --status halted --status awaiting_approval"].stdout
    assert "charge-2" in for_a_person and "order-1" not in for_a_person
    assert {row["run_id"] for row in json.loads(by_command["bide runs --json"].stdout)} == {
        "order-1",
        "charge-2",
    }
    assert by_command["bide show charge-2"].stdout.startswith("run charge-2: halted")
    shown = json.loads(by_command["bide show charge-2 --json"].stdout)
    assert shown["run"]["status"] == "halted" and shown["records"][0]["key"] == "@journal"
    pending = by_command["bide pending"].stdout
    assert "ship-3" in pending and "waiting for alice" in pending
    assert (tmp_path / "alice.key.pub").is_file()


# --- docs/operations.md -----------------------------------------------------------------------------------

SUPPORT_APP = '''"""The support agent of docs/operations.md, for `bide worker --app myapp.agents:build`."""
import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def look_up(order: str) -> str:
    """Look an order up."""
    return f"{order}: paid"


TOOLS = [look_up]


def build(store):
    model = ScriptedModel([call("look_up", order="o-7"), reply("o-7 is paid.")])
    return bide.Agent(model, store=store, tools=TOOLS, name="support")
'''


def test_operations_worker_commands_run_as_written(tmp_path: Path) -> None:
    """docs/operations.md's two `bide worker` lines, each with a run whose driver died waiting in
    bide.db and the support agent as `myapp.agents:build`: the first resumes it, runs until SIGINT and
    then exits 0; the second resumes another in one pass, prints its report and exits 0."""
    sh = shell(tmp_path)
    app = write_app(tmp_path, SUPPORT_APP)
    forever, once = commands("operations.md", 0)
    assert "--once" in once and "--once" not in forever
    first = call("look_up", order="o-7")

    with sqlite_store(tmp_path) as store:
        crash(store, app, "support", "ticket-7", "Where is order o-7?", first)
    with sh.background(forever) as worker:
        wait_until_completed(tmp_path, ["ticket-7"], worker)
        assert worker.stop(signal.SIGINT) == 0, worker.logs()

    with sqlite_store(tmp_path) as store:
        crash(store, app, "support", "ticket-9", "Where is order o-7?", first)
    report = sh.run(once).stdout
    assert "resumed 1 run: 1 completed" in report
    with sqlite_store(tmp_path) as store:
        assert bide.run_status(store, "ticket-9").answer == "o-7 is paid."


# --- docs/audit.md ----------------------------------------------------------------------------------------

APPROVALS_APP = '''"""The payments agent of docs/audit.md: `wire` needs 2 of the 3 approvers' signatures."""
import bide
from bide.approvals import ApprovalGate
from bide.testing import ScriptedModel, call, reply


def build(store):
    gate = ApprovalGate.k_of_n(2, {"alice": "alice.key.pub", "bob": "bob.key.pub", "carol": "carol.key.pub"})

    @bide.tool(gate=gate)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        return f"sent {amount} to {to}"

    model = ScriptedModel([call("wire", amount=100, to="acme"), reply("done")])
    return bide.Agent(model, store=store, tools=[wire])
'''


def test_audit_shell_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/audit.md's shell session, in order, from what its text says the reader has: `invoice-7`
    waiting at a 2-of-3 approval gate in bide.db, the approvers' keys alice.key, bob.key and carol.key
    (and .pub), the app `myapp.agents:build`, and an anchor directory for `/mnt/anchor`. Every line exits
    0: the heads, evidence, bundle and proof it writes all verify, and the pinned approvers check out."""
    sh = shell(tmp_path)
    for name in ("alice", "bob", "carol"):
        generate_key(tmp_path / f"{name}.key")
    app = write_app(tmp_path, APPROVALS_APP)
    monkeypatch.chdir(tmp_path)
    with sqlite_store(tmp_path) as store, pytest.raises(bide.ApprovalPending):
        app.build(store).run_sync("invoice-7", "pay acme")
    anchor = tmp_path / "anchor"
    anchor.mkdir()

    done: dict[str, str] = {}
    for line in commands("audit.md", 0):
        done[line] = sh.run(line.replace("/mnt/anchor", str(anchor))).stdout
    said = "\n".join(done.values())
    assert "a signed head of run 'invoice-7' at 5 records to head-then.json" in said  # the "# 5 records"
    assert "waiting for alice, bob, carol" in said  # bide pending
    assert "resumed 1 run: 1 completed" in said  # the gate counted 2 of 3 and wire ran
    assert "was approved by alice (" in said and "carol (" in said
    assert "extends, unchanged, the journal at 5 records" in said
    assert [p.suffix for p in anchor.rglob("*") if p.is_file()] == [".json"]  # the anchored head


# --- docs/certificate.md ----------------------------------------------------------------------------------


def _checkout_layout(where: Path) -> None:
    shutil.copytree(ROOT / "examples", where / "examples")
    shutil.copytree(ROOT / "certs", where / "certs")


def test_certificate_commands_run_in_order_and_check_prints_what_is_shown(tmp_path: Path) -> None:
    """docs/certificate.md's first list of commands, run top to bottom from a checkout's layout (the
    examples and an empty certs/ folder), each exits 0; then `govern check` of the certificate they
    signed prints what the next block shows."""
    sh = shell(tmp_path)
    _checkout_layout(tmp_path)
    first = commands("certificate.md", 0)
    assert any("govern graph" in c for c in first)
    committed = {p: p.read_bytes() for p in (tmp_path / "certs").rglob("*") if p.is_file()}
    for line in first:
        sh.run(line)
    # The committed certificates are left as they are (a signed copy over one failed `make test`).
    assert {p: p.read_bytes() for p in (tmp_path / "certs").rglob("*") if p.is_file()} == committed
    [check] = examples("certificate.md", 1)
    assert check.shown is not None
    assert_shows(check.shown, sh.run(check.command).stdout)


def test_certificate_ci_commands_pass_on_a_current_certificate_and_fail_as_their_comments_say(
    tmp_path: Path,
) -> None:
    """docs/certificate.md's CI lines in a git repository with machines/orders.py, its certificate
    committed in certs/, a dist/ folder and $GOVERN_SIGNING_KEY naming a key: each exits 0 and dist/ gets a
    signed certificate. Then what the comments say: after the machine changes, the certify line writes a
    certificate that differs from the committed one and `git diff --exit-code` fails (exit 1); with a
    machine that does not converge, the certify line exits 1."""
    sh = shell(tmp_path)
    (tmp_path / "machines").mkdir()
    (tmp_path / "certs").mkdir()
    (tmp_path / "dist").mkdir()
    machine = tmp_path / "machines" / "orders.py"
    shutil.copy(ROOT / "examples" / "orders.py", machine)
    shutil.copy(ROOT / "certs" / "orders.govern-cert.json", tmp_path / "certs")
    generate_key(tmp_path / "ci-key")
    sh.env["GOVERN_SIGNING_KEY"] = str(tmp_path / "ci-key")
    git = "git -c user.name=ci -c user.email=ci@example.com -c init.defaultBranch=main"
    sh.run(f"{git} init -q && {git} add machines certs && {git} commit -q -m machines")

    certify, diff, sign = commands("certificate.md", 2)
    assert "exit 1: not convergent" in certify and "stale certificate: fail" in diff
    for line in (certify, diff, sign):
        sh.run(line)
    assert "signature" in json.loads((tmp_path / "dist" / "orders.govern-cert.json").read_bytes())

    machine.write_text(
        machine.read_text().replace('registry.int("stock", 0, 5)', 'registry.int("stock", 0, 6)')
    )
    sh.run(certify)
    sh.run(diff, code=1)

    shutil.copy(ROOT / "examples" / "naive_pay_ship.py", machine)
    assert "does not converge" in sh.run(certify, code=1).stdout


LIMITS_START = "from govern import NotConvergent, Registry, max_, min_\n"


def test_symbolic_certificate_commands_print_what_is_shown(tmp_path: Path) -> None:
    """docs/certificate.md's symbolic example: with limits.py holding docs/govern.md's `limits` machine
    (its lines before the build), `govern certify limits.py` exits 0 and `govern check` of what it wrote
    prints what the doc shows."""
    sh = shell(tmp_path)
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / "govern.md").read_text(), re.S | re.M)
    [example] = [b for b in blocks if 'Registry("limits")' in b]
    assert example.startswith(LIMITS_START)
    (tmp_path / "limits.py").write_text(example[: example.index("limits = r.build()")])
    certify, check = examples("certificate.md", 3)
    sh.run(certify.command)
    assert check.shown is not None
    assert_shows(check.shown, sh.run(check.command).stdout)


def test_regenerating_the_committed_certificates_runs_as_written(tmp_path: Path) -> None:
    """docs/certificate.md's last two commands, in a copy of the checkout's examples/, certs/,
    tests/certify/regenerate.py and benchmarks/certificate.py: both exit 0, and since nothing changed
    certs/ is byte for byte what is committed (certificates are reproducible)."""
    sh = shell(tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "certs", tmp_path / "certs")
    (tmp_path / "tests" / "certify").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "certify" / "regenerate.py", tmp_path / "tests" / "certify")
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "certificate.py", tmp_path / "benchmarks")
    for line in commands("certificate.md", 4):
        sh.run(line)
    committed = {
        p.relative_to(ROOT / "certs"): p.read_bytes() for p in (ROOT / "certs").rglob("*") if p.is_file()
    }
    now = {
        p.relative_to(tmp_path / "certs"): p.read_bytes()
        for p in (tmp_path / "certs").rglob("*")
        if p.is_file()
    }
    assert now == committed


# --- docs/protocols.md ------------------------------------------------------------------------------------


def _protocol_block() -> str:
    [block] = commands("protocols.md", 0)
    return block.replace("/path/to/bide", shlex.quote(str(ROOT)))


def test_protocol_command_finds_the_seeded_double_fire(tmp_path: Path) -> None:
    """docs/protocols.md's SPIN command, run as its comment says to see the bug it prevents (with
    -DBUG_NO_WINDOW on the spin line, and the checkout for /path/to/bide): the checker reports an error,
    the tool firing twice. (Without spin or gcc this fails, as tests/protocols does.)"""
    for tool in ("spin", "gcc"):
        assert shutil.which(tool), f"{tool} is missing: run tests/infra/ensure-spin.sh (make test does)"
    sh = shell(tmp_path)
    block = _protocol_block()
    assert block.count("spin -a ") == 1
    output = sh.run(block.replace("spin -a ", "spin -a -DBUG_NO_WINDOW ")).stdout
    assert "max search depth too small" not in output, output
    assert "errors: 1" in output and "assertion violated (fired<=1)" in output, output


def test_protocol_command_is_the_one_the_model_test_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/protocols.md's SPIN command for claim.pml (without the seeded bug) is, command for command,
    what tests/protocols/test_spin_models.py runs to check that model exhaustively (its "errors: 0" is
    that test's assertion), so the doc's line is run there and not twice."""
    path = ROOT / "tests" / "protocols" / "test_spin_models.py"
    spec = importlib.util.spec_from_file_location("_docs_shell_spin_models", path)
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, models)  # its dataclass looks its module up there
    spec.loader.exec_module(models)
    ran: list[list[str]] = []

    def record(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "errors: 0\n5000 states, stored\n", "")

    monkeypatch.setattr(models, "subprocess", type("Recorder", (), {"run": staticmethod(record)}))
    models.check("claim.pml", tmp_path)
    steps = [shlex.split(step) for step in _protocol_block().split("&&")]
    assert steps[0] == ["cd", "$(mktemp -d)"]
    assert steps[1:] == ran


# --- docs/benchmarks.md -----------------------------------------------------------------------------------


def test_benchmark_setup_names_the_extras_pyproject_defines() -> None:
    """docs/benchmarks.md's `pip install -e '.[EXTRA]'` lines name extras pyproject.toml defines (this
    test does not install anything), and the peers' comment lists exactly the peers extra's packages."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = [c for i in (0, 1) for c in commands("benchmarks.md", i) if c.startswith("pip install")]
    named = [re.fullmatch(r"pip install -e '\.\[(\w+)\]'\s+# (.*)", c) for c in installs]
    assert [m.group(1) for m in named if m] == ["test", "peers"], installs
    peers = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras["peers"]}
    [listed] = [m.group(2) for m in named if m and m.group(1) == "peers"]
    assert set(listed.split(", ")) == peers


def test_crash_benchmark_commands_are_accepted_by_the_script(tmp_path: Path) -> None:
    """docs/benchmarks.md's crash benchmark command lines, run from the repository root after the block's
    `export PYTHONPATH=$PWD`, are accepted by benchmarks/crash/run.py's parser: each line with
    `--trials 0` added, which the script refuses after parsing every argument and before any trial, ends
    with that refusal and not with an unknown option. (The benchmark itself takes minutes; its smoke run,
    --quick, is tests/test_benchmarks_run.py's crash test.)"""
    sh = shell(tmp_path)
    sh.cwd = ROOT
    [export] = [c for c in commands("benchmarks.md", 0) if not c.startswith("pip install")]
    runs = [c for i in (1, 2, 3, 4) for c in commands("benchmarks.md", i) if c.startswith("python ")]
    assert len(runs) == 4
    for line in runs:
        refused = sh.run(f"{export} && {line.split('#')[0].strip()} --trials 0", code=2)
        assert "--trials, --overhead-runs and --jobs must be at least 1" in refused.stderr, refused.stderr
    assert not (ROOT / "crash.json").exists()


# --- every block is run -----------------------------------------------------------------------------------


def test_every_shell_block_is_run_by_a_test() -> None:
    """The shell blocks of docs/*.md are exactly those this file runs (a new block needs a test)."""
    found = {(doc.name, i) for doc in DOCS.glob("*.md") for i in range(len(_shell_blocks(doc.name)))}
    assert found == set(SHELL_BLOCKS)
    for doc, index in SHELL_BLOCKS:
        examples(doc, index)  # each block still starts where its test expects
