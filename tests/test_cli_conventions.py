"""`bide`, `bide-audit` and `govern` follow one convention (docs/cli.md), checked through subprocesses:
`--version`, one exit-code table in every `--help`, suggestions for common mistakes, `keygen FILE` in one
form and one key file format, JSON for programs, tables for people, sanitized output."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import bide
from bide._cli_common import EXIT_CODES_HELP, internal_error, version
from bide.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"bide": "bide._cli", "bide-audit": "bide.audit._cli", "govern": "govern"}
EVIL = "\x1b[2K\r\x1b[32mOK\x1b[0m\u202e"


def run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "BIDE_STORE": ""}
    env.pop("BIDE_STORE")
    return subprocess.run(
        [sys.executable, "-m", COMMANDS[prog], *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=120,
    )


def run_all(prog: str, *calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """`run(prog, *args)` for each of `calls`, all at once: for commands that do not depend on each other
    (the same CPU work; a free core makes it faster)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: run(prog, *args, cwd=cwd), calls))


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_version_help_table_and_suggestion_are_the_same_everywhere(prog: str, tmp_path: Path) -> None:
    shown, helped, sub, typo = run_all(
        prog, ("--version",), ("--help",), ("keygen", "--help"), ("keygne", "k"), cwd=tmp_path
    )
    assert shown.returncode == 0 and shown.stdout.strip() == f"{prog} {version()}"
    assert helped.returncode == 0 and EXIT_CODES_HELP in helped.stdout
    assert "--debug" in helped.stdout
    assert sub.returncode == 0 and EXIT_CODES_HELP in sub.stdout and "FILE" in sub.stdout
    assert typo.returncode == 2 and f"did you mean `{prog} keygen`?" in typo.stderr


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_keygen_file_writes_one_format_every_command_reads(prog: str, tmp_path: Path) -> None:
    from bide.audit._keys import load_public_key, load_signing_key
    from govern.certificate._signing import load_private_key
    from govern.certificate._signing import load_public_key as govern_public_key

    made = run(prog, "keygen", "ci.key", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = tmp_path / "ci.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    signing = load_signing_key(key)
    assert load_private_key(key).key_id == signing.key_id  # govern signs with a key bide made, and back
    assert load_public_key(str(key) + ".pub").key_id == signing.key_id
    assert govern_public_key(Path(str(key) + ".pub")) is not None
    assert signing.key_id in made.stdout

    again = run(prog, "keygen", "ci.key", cwd=tmp_path)
    assert again.returncode == 2 and key.read_bytes() == signing.pem()  # never overwritten silently
    forced = run(prog, "keygen", "ci.key", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and load_signing_key(key).key_id != signing.key_id


def test_govern_points_from_a_common_mistake_to_the_right_command(tmp_path: Path) -> None:
    (tmp_path / "machine.py").write_text("from govern import Registry\n")
    (tmp_path / "cert.json").write_text("{}")
    checked, certified, checked_json, shown, negative = run_all(
        "govern",
        ("check", "machine.py"),
        ("certify", "cert.json"),
        ("check", "machine.py", "--json"),
        ("show", "machine.py"),  # (it said only "not valid JSON at line 1")
        ("graph", "machine.py", "--state-limit", "-1"),  # (it was taken, as no limit at all)
        cwd=tmp_path,
    )
    assert checked.returncode == 4 and "did you mean `govern certify machine.py`?" in checked.stderr
    assert shown.returncode == 4 and "did you mean `govern certify machine.py`?" in shown.stderr
    assert negative.returncode == 2 and "--state-limit: must be 0 or more" in negative.stderr
    assert certified.returncode == 2 and "`govern check cert.json`" in certified.stderr
    as_json = json.loads(checked_json.stdout)
    assert as_json["exit_code"] == 4 and "govern certify" in as_json["message"]


class _Hold:
    """A gate that is not an approval gate: it pauses every call until a person looks."""

    def check(self, request: bide.GateRequest) -> bide.Pending:
        return bide.Pending(f"hold for review of {request.tool}")


def _store_with_runs(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)

    @bide.tool(timeout=30)
    def send(to: str) -> str:
        """Send."""
        raise OSError("lost after the request went out")

    @bide.tool(gate=_Hold())
    def wire(amount: int) -> str:
        """Wire money."""
        return "wired"

    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("done", "hello" + EVIL)
    # The sender's clock runs a minute behind (its call's deadline has passed on the wall clock), so the call
    # had all its 30 s to start: a short timeout, waited out, could close before the marker's commit and a
    # worker thread let it start on a loaded machine (ToolNotStarted, not the halt these tests show).
    model = ScriptedModel([call("send", to="x"), reply("ok")])
    sender = bide.Agent(model, store=store, tools=[send], clock=lambda: time.time() - 60)
    with contextlib.suppress(bide.OutcomeUnknown):
        sender.run_sync("stuck", "send it")
    with contextlib.suppress(bide.ApprovalPending):
        bide.Agent(ScriptedModel([call("wire", amount=5), reply("ok")]), store=store, tools=[wire]).run_sync(
            "held", "wire it"
        )
    store.close()
    return url


def test_bide_operator_commands_print_tables_and_json(tmp_path: Path) -> None:
    url = _store_with_runs(tmp_path)
    runs_json, text, only_halted, pending_json, pending = run_all(
        "bide",
        ("runs", "--store", url, "--json"),
        ("runs", "--store", url),
        ("runs", "--store", url, "--status", "halted", "--json"),
        ("pending", "--store", url, "--json"),
        ("pending", "--store", url),
        cwd=tmp_path,
    )
    rows = json.loads(runs_json.stdout)
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["stuck"]["status"] == "halted" and by_id["held"]["status"] == "awaiting_approval"
    assert by_id["done"]["status"] == "completed"
    assert rows[-1]["last_activity"] is None  # the answered run recorded no time: it comes last
    assert by_id["stuck"]["lease_holder"] is not None and by_id["stuck"]["lease_live"] is False

    assert text.returncode == 0 and "STATUS" in text.stdout and "LAST ACTIVITY" in text.stdout
    assert "halted at c0.0 (send)" in text.stdout and "released" in text.stdout and " ago)" in text.stdout

    assert [r["run_id"] for r in json.loads(only_halted.stdout)] == ["stuck"]

    pending_rows = json.loads(pending_json.stdout)
    assert [(p["run_id"], p["tool"], p["reason"], p["approval"]) for p in pending_rows] == [
        ("held", "wire", "hold for review of wire", None)
    ]
    listed = pending.stdout
    assert "held" in listed and "hold for review of wire" in listed

    long_arg = "y" * 400
    store = bide.open_store(url)
    with contextlib.suppress(bide.ApprovalPending):
        wire_tool = bide.tool(gate=_Hold())(_wire_long)
        bide.Agent(
            ScriptedModel([call("_wire_long", note=long_arg), reply("ok")]), store=store, tools=[wire_tool]
        ).run_sync("long", "go")
    store.close()
    shown, full_json, said_text, dumped_json = run_all(
        "bide",
        ("show", "--store", url, "long"),
        ("show", "--store", url, "long", "--json"),
        ("show", "--store", url, "done"),
        ("show", "--store", url, "done", "--json"),
        cwd=tmp_path,
    )
    assert shown.returncode == 0 and long_arg in shown.stdout.replace("\n", "")  # nothing cut at 160
    full = json.loads(full_json.stdout)
    assert full["run"]["arguments"] == {"note": long_arg}
    assert full["run"]["status"] == "awaiting_approval" and full["records"][0]["key"] == "@journal"

    said = said_text.stdout
    assert "\x1b" not in said and "\u202e" not in said
    assert "hello\\x1b[2K\\x0d\\x1b[32mOK" in said  # the input is shown as escapes, never acted on
    dumped = dumped_json.stdout
    assert "\x1b" not in dumped and json.loads(dumped)["run"]["input"] == "hello" + EVIL


def _wire_long(note: str) -> str:
    """Wire with a long note."""
    return "wired"


def test_bide_exit_codes_follow_the_shared_table(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    url = _store_with_runs(tmp_path)
    *absent, nope, bogus, broken = run_all(
        "bide",
        ("runs", "--store", missing),
        ("show", "x", "--store", missing),
        ("pending", "--store", missing),
        ("show", "--store", url, "nope"),
        ("runs", "--store", url, "--status", "bogus"),
        ("runs", "--store", "postgresql://nobody@127.0.0.1:1/none"),
        cwd=tmp_path,
    )
    for done in absent:
        assert done.returncode == 4 and "no bide store" in done.stderr, done.args
    assert not (tmp_path / "missing.db").exists()
    assert nope.returncode == 4
    assert bogus.returncode == 2
    assert broken.returncode == 6, broken.stderr


def test_internal_errors_say_bug_and_show_a_traceback_only_with_debug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        raise RuntimeError("boom" + EVIL)
    except RuntimeError as exc:
        assert internal_error("bide", exc, debug=False) == 3
        quiet = capsys.readouterr().err
        assert internal_error("bide", exc, debug=True) == 3
        loud = capsys.readouterr().err
    assert "this is a bug" in quiet and "Traceback" not in quiet and "\x1b" not in quiet
    assert "Traceback" in loud


def _with_stdout_closed(prog: str, *args: str, cwd: Path) -> tuple[int, str]:
    """Run a command whose reader has gone away before it writes (`cmd | head -0`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", COMMANDS[prog], *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), err


def _with_stdout_full(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command whose standard output is a full disk (`cmd > /dev/full`)."""
    with open("/dev/full", "w") as full:
        command = [sys.executable, "-m", COMMANDS[prog], *args]
        return subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, cwd=cwd)


def test_a_reader_that_goes_away_does_not_change_the_verdict(tmp_path: Path) -> None:
    """`govern check cert | head` exited 1 ("not valid") for a valid certificate, and bide-audit printed a
    traceback: the exit code is the command's verdict, whatever happened to the reader."""
    cert = str(ROOT / "certs" / "orders.govern-cert.json")
    for args in (("check", cert), ("check", cert, "--json")):
        assert _with_stdout_closed("govern", *args, cwd=tmp_path) == (0, "")
    assert run("bide-audit", "keygen", "k", cwd=tmp_path).returncode == 0
    (tmp_path / "bad.json").write_text("{nope")
    verify = ("verify", "bad.json", "--pubkey", "k.pub", "--json")
    code, err = _with_stdout_closed("bide-audit", *verify, cwd=tmp_path)
    assert code == 4 and "Traceback" not in err, err
    lost = _with_stdout_full("bide-audit", *verify, cwd=tmp_path)  # the output is lost: not a verdict
    assert lost.returncode == 2 and "could not be written" in lost.stderr, lost.stderr
    for args in (("check", cert), ("check", cert, "--json"), ("show", cert)):
        # exit 1 from `govern check` means "not valid": a full disk behind stdout made it say so
        lost = _with_stdout_full("govern", *args, cwd=tmp_path)
        assert lost.returncode == 2 and "could not be written" in lost.stderr, (args, lost.stderr)
        assert "Traceback" not in lost.stderr


def test_bide_keeps_its_exit_code_when_the_reader_goes_and_reports_a_lost_output(tmp_path: Path) -> None:
    """`bide runs --json | head` exited 3 (a BrokenPipeError reported as a bug), `bide show | head -1` 1,
    and `bide runs > /dev/full` 3: a reader that went away leaves the command's own exit code, a full disk
    is exit 2 with a message."""
    import bide
    from bide.testing import ScriptedModel, reply

    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        for i in range(300):  # more output than a pipe holds
            bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync(f"run-{i:03d}", "hello " * 20)
    finally:
        store.close()
    commands = [("runs", "--store", url, "--json"), ("runs", "--store", url)]
    commands.append(("show", "--store", url, "run-000"))
    for args in commands:
        code, err = _with_stdout_closed("bide", *args, cwd=tmp_path)
        assert (code, err) == (0, ""), (args, code, err)
        lost = _with_stdout_full("bide", *args, cwd=tmp_path)
        assert lost.returncode == 2 and "could not be written" in lost.stderr, (args, lost.stderr)


def test_arguments_refused_with_json_still_print_one_json_document(tmp_path: Path) -> None:
    """`--json` prints one JSON document on every exit (docs/cli.md), arguments argparse refuses too: a
    program parsing the output got an empty stdout."""
    for prog, args in [
        ("bide", ("runs", "--json", "--limit", "abc")),
        ("bide", ("runs", "--json", "--bogus")),
        ("bide-audit", ("verify", "x", "--json", "--max-input-bytes", "abc")),
        ("govern", ("check", "x", "--json", "--max-size", "abc")),
    ]:
        done = run(prog, *args, cwd=tmp_path)
        assert done.returncode == 2, (prog, args, done.stderr)
        doc = json.loads(done.stdout)
        assert doc["exit_code"] == 2 and ("abc" in doc["message"] or "--bogus" in doc["message"])
        assert "usage error" in done.stderr
    plain = run("bide", "runs", "--limit", "abc", cwd=tmp_path)
    assert plain.returncode == 2 and plain.stdout == ""  # without --json: the usage on stderr only


def _with_no_stdout(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command started with its standard output closed (`>&-`): Python's sys.stdout is None."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", COMMANDS[prog], *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": path}, timeout=120,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip


def test_a_command_started_with_standard_output_closed_says_its_output_is_lost(tmp_path: Path) -> None:
    """`>&-`: each command crashed on sys.stdout being None (exit 1 with tracebacks, or 3, "a bug"); one
    that prints says its output is lost (exit 2), one that prints nothing keeps its own code."""
    cert = str(ROOT / "certs" / "orders.govern-cert.json")
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("r1", "hi")
    store.close()
    for prog, args, code in [
        ("govern", ("check", cert), 2),
        ("govern", ("check", "missing.json"), 4),
        ("bide", ("runs", "--store", url, "--json"), 2),
        ("bide-audit", ("keygen", "k"), 2),
    ]:
        done = _with_no_stdout(prog, *args, cwd=tmp_path)
        assert done.returncode == code, (prog, args, done.stderr)
        assert "Traceback" not in done.stderr and "bug" not in done.stderr, (prog, args, done.stderr)


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_help_and_version_that_cannot_be_written_exit_2(prog: str, tmp_path: Path) -> None:
    """argparse drops the errors of its own writes: `--help > /dev/full` and `--help >&-` exited 0 with the
    help lost. A reader that goes away (`--help | head -1`) is still 0."""
    sub = {"bide": ("worker",), "bide-audit": ("export",), "govern": ("check",)}[prog]
    for args in (("--help",), ("--version",), (*sub, "--help")):
        lost = _with_stdout_full(prog, *args, cwd=tmp_path)
        assert lost.returncode == 2 and "could not be written" in lost.stderr, (args, lost.stderr)
        closed = _with_no_stdout(prog, *args, cwd=tmp_path)
        assert closed.returncode == 2 and "could not be written" in closed.stderr, (args, closed.stderr)
        assert _with_stdout_closed(prog, *args, cwd=tmp_path) == (0, "")
        assert run(prog, *args, cwd=tmp_path).returncode == 0
        with open("/dev/full", "w") as full:  # standard error full too: no message, the code all the same
            both = subprocess.run([sys.executable, "-m", COMMANDS[prog], *args], stdout=full, stderr=full)
        assert both.returncode == 2, args


def test_a_command_started_with_standard_error_or_both_streams_closed_keeps_its_code(tmp_path: Path) -> None:
    """`2>&-`: a usage error crashed writing to None (exit 1); with both streams closed, the notice that the
    output was lost went to the closed output and crashed too (exit 1, "not verified" for bide-audit)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

    def closed(prog: str, *args: str, fds: tuple[int, ...]) -> int:
        def close() -> None:
            for fd in fds:
                os.close(fd)

        return subprocess.run(
            [sys.executable, "-m", COMMANDS[prog], *args], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, timeout=120,
            preexec_fn=close,
        ).returncode  # fmt: skip

    assert closed("bide", "--bogus", fds=(2,)) == 2
    assert closed("govern", "--bogus", fds=(2,)) == 2
    assert closed("bide-audit", "verify-evidence", "missing.json", "--pubkey", "k.pub", fds=(1, 2)) == 4
    assert closed("govern", "check", str(ROOT / "certs" / "orders.govern-cert.json"), fds=(1, 2)) == 2
