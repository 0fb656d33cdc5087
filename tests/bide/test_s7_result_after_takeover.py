"""A driver whose side-effect call returned, and which then lost the run's lease before it journaled the
result (paused past its lease: SIGSTOP, as a long GC pause or a frozen VM would), raised RunInFlight saying
only that another driver took the run over: what the call returned was lost from view, while the other
driver halted the run with OutcomeUnknown for a person, who needs exactly that value. The fenced-out driver
now raises `ResultNotJournaled`, which says the call ran, what it returned (also as `returned`) and how to
resolve the halt with it; running the run again in that process journals the kept result."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paused import is_paused

import bide
import bide._lease
from bide.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# A driver of run "order-1" whose side effect appends to a ledger and returns a charge id. With a SIGNAL
# path, it stops itself (SIGSTOP) once the call returned, before its result is written, having written
# "paused" to SIGNAL; the parent wakes it with SIGCONT. Prints one JSON line per drive (with SIGNAL: the
# drive that was paused, then, with DRIVE_AGAIN=1, one more).
DRIVER = """
import json, os, sys
from signal import SIGSTOP
import bide, bide._agent
from bide.testing import ScriptedModel, call, reply

url, prefix, ledger = sys.argv[1:4]
signal_file = sys.argv[4] if len(sys.argv) > 4 else None

if signal_file is not None:
    journal_result = bide._agent._journal_result

    async def paused_before_the_write(journal, result):
        with open(signal_file + ".tmp", "w") as f:
            f.write("paused")
        os.replace(signal_file + ".tmp", signal_file)
        os.kill(os.getpid(), SIGSTOP)  # until the parent's SIGCONT
        return await journal_result(journal, result)

    bide._agent._journal_result = paused_before_the_write

def charge(cents: int) -> dict:
    \"\"\"Charge a card.\"\"\"
    with open(ledger, "a") as f:
        f.write(f"{cents} {os.getpid()}\\n")
    return {"charge_id": "ch_1", "cents": cents}

def drive() -> dict:
    model = ScriptedModel([call("charge", cents=500), reply("Done.")])
    agent = bide.Agent(model, store=store, tools=[bide.Tool.from_function(charge, timeout=5.0)],
                       lease_ttl=0.6, lease_wait=5.0, clock_skew=0.2)
    try:
        return {"outcome": "completed", "answer": agent.run_sync("order-1", "charge 500").answer}
    except bide.BideError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "returned": getattr(exc, "returned", None),
                "attempt": getattr(exc, "attempt", None), "call_id": getattr(exc, "call_id", None)}

store = bide.open_store(url, table_prefix=prefix)
try:
    print(json.dumps(drive()), flush=True)
    if signal_file is not None and os.environ.get("DRIVE_AGAIN") == "1":
        bide._agent._journal_result = journal_result
        print(json.dumps(drive()), flush=True)
finally:
    store.close()
"""


def _driver(url: str, prefix: str, ledger: Path, *signal_file: Path) -> list[str]:
    return [sys.executable, "-c", DRIVER, url, prefix, str(ledger), *map(str, signal_file)]


def _env(*, again: bool = False) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "DRIVE_AGAIN": "1" if again else "", "PYTHONPATH": path}


def _paused_after_the_call(
    url: str, prefix: str, ledger: Path, paused: Path, *, again: bool
) -> subprocess.Popen[str]:
    first = subprocess.Popen(
        _driver(url, prefix, ledger, paused),
        env=_env(again=again),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (paused.exists() and is_paused(first.pid)):  # it stops itself there
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            _, err = first.communicate(timeout=60)
            pytest.fail(f"the first driver never stopped after its call: {err}")
        time.sleep(0.005)
    return first


def _halted_by_another_driver(url: str, prefix: str, ledger: Path) -> dict[str, object]:
    # Past the deadline the call's marker recorded, and the clock skew (0.2 s): the other driver then halts
    # on the call at once (it waits out the paused driver's lease itself, lease_wait 5 s).
    store = bide.open_store(url, table_prefix=prefix)
    try:
        marker = store.get("order-1", "attempt:c0.0:0")
    finally:
        store.close()
    assert marker is not None
    deadline = json.loads(marker.data)["deadline_ms"] / 1000
    time.sleep(max(0.0, deadline + 1.0 - time.time()))
    second = subprocess.run(_driver(url, prefix, ledger), env=_env(), capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    halted: dict[str, object] = json.loads(second.stdout)
    return halted


def test_a_driver_taken_over_after_its_call_returned_says_what_it_returned(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = durable_store_spec
    ledger, paused = tmp_path / "ledger", tmp_path / "paused"
    first = _paused_after_the_call(url, prefix, ledger, paused, again=True)
    try:
        halted = _halted_by_another_driver(url, prefix, ledger)
        assert halted["error"] == "OutcomeUnknown", halted
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    fenced_out, again = (json.loads(line) for line in out.splitlines())

    assert fenced_out["error"] == "ResultNotJournaled", (fenced_out, err)
    assert fenced_out["returned"] == {"charge_id": "ch_1", "cents": 500}
    assert (fenced_out["call_id"], fenced_out["attempt"]) == ("c0.0", 0)
    message = str(fenced_out["message"])
    assert 'ran and returned {"cents":500,"charge_id":"ch_1"}' in message
    assert "another driver took over the run's lease before its result was journaled" in message
    value = '{"cents":500,"charge_id":"ch_1"}'
    assert f"bide resolve --store URL '--succeeded={value}' --attempt 0 -- order-1 c0.0" in message
    # As the message says: run again in the process that keeps the result, it is journaled, not called again.
    assert again == {"outcome": "completed", "answer": "Done."}, err
    assert len(ledger.read_text().splitlines()) == 1
    store = bide.open_store(url, table_prefix=prefix)
    try:
        result = store.get("order-1", "result:c0.0")
        assert result is not None and b"ch_1" in result.data
    finally:
        store.close()


def test_the_value_it_gives_resolves_the_other_drivers_halt(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """The process that kept the result ends without running the run again: a person resolves the halt
    with the command its error gave, and the run goes on from there with that value."""
    url, prefix = durable_store_spec
    ledger, paused = tmp_path / "ledger", tmp_path / "paused"
    first = _paused_after_the_call(url, prefix, ledger, paused, again=False)
    try:
        halted = _halted_by_another_driver(url, prefix, ledger)
        assert halted["error"] == "OutcomeUnknown", halted
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=120)  # it ends keeping the result, without running again
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    fenced_out = json.loads(out)
    assert fenced_out["error"] == "ResultNotJournaled", (fenced_out, err)

    # The command the message gives, as a person would type it (their store in place of URL).
    said = re.search(r"\(bide resolve --store URL (.*?), or bide\.resolve_halt\)", str(fenced_out["message"]))
    assert said is not None, fenced_out["message"]
    command = ["--store", url, "--table-prefix", prefix, *shlex.split(said.group(1))]
    resolved = subprocess.run([sys.executable, "-m", "bide._cli", "resolve", *command], env=_env(),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert resolved.returncode == 0, (command, resolved.stdout, resolved.stderr)
    done = subprocess.run(_driver(url, prefix, ledger), env=_env(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert json.loads(done.stdout) == {"outcome": "completed", "answer": "Done."}, done.stderr
    assert len(ledger.read_text().splitlines()) == 1
    store = bide.open_store(url, table_prefix=prefix)
    try:
        result = store.get("order-1", "result:c0.0")
        assert result is not None and b'"charge_id":"ch_1"' in result.data.replace(b" ", b"")
    finally:
        store.close()


def test_a_call_past_its_deadline_that_returns_after_a_takeover_logs_what_it_returned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same for a synchronous call that ran on past its deadline: the thread that journals its outcome
    when it returns found the run taken over, and logged only that the result could not be journaled. The
    warning says what it returned now."""
    import threading

    store = bide.MemoryStore()
    go = threading.Event()

    def charge(cents: int) -> dict[str, object]:
        """Charge a card."""
        go.wait(60)
        return {"charge_id": "ch_9", "cents": cents}

    tool = bide.Tool.from_function(charge, timeout=0.2)
    model = ScriptedModel([call("charge", cents=700), reply("Done.")])
    agent = bide.Agent(model, store=store, tools=[tool], lease_ttl=30)
    loop = asyncio.new_event_loop()  # closed once the call returned: run_sync and asyncio.run wait for it
    with pytest.raises(bide.OutcomeUnknown) as halted:
        loop.run_until_complete(agent.run("order-9", "charge 700"))
    assert halted.value.running_here
    # Another driver takes the run over (as if this process had been paused past its lease).
    taken = store.lease("order-9", "other", now_ms=int(time.time() * 1000) + 3_600_000, ttl_ms=60_000)
    assert taken.held
    with caplog.at_level("WARNING", logger="bide"):
        go.set()
        bide._lease.join_keepers()
        for thread in threading.enumerate():
            if thread.name.startswith("bide-overrun"):
                thread.join(60)
    loop.close()
    said = [r.getMessage() for r in caplog.records if "could not be journaled" in r.getMessage()]
    assert len(said) == 1, caplog.text
    returned = 'returned {"cents":700,"charge_id":"ch_9"}'
    assert "call 'c0.0' (charge), which ran past its deadline" in said[0]
    assert returned in said[0]


@pytest.mark.parametrize(
    ("run_id", "returned", "is_error"),
    [("-order-2", {"ok": 5}, False), ("order-3", "-declined", True), ("order-4", -5, False),
     ("order 5", "it's \"odd\"\n$(id)", True)],
)  # fmt: skip
def test_the_resolve_line_reads_back_as_the_value_whatever_it_starts_with(
    run_id: str, returned: object, is_error: bool
) -> None:
    """The line is read by bide's own parser as the value and the ids it names. Before, a value or a run id
    starting with "-" ("--failed -declined", "-order-2 c0.0") was taken for an option: a usage error."""
    from bide._agent import _resolve_option
    from bide._cli import build_parser
    from bide._records import ToolResult

    result = ToolResult(key="result:c0.0", call_id="c0.0", tool="charge", result=returned, is_error=is_error,
                        safety="side_effect")  # fmt: skip
    line = f"{_resolve_option(result)} --attempt 0 -- {shlex.quote(run_id)} c0.0"
    parser, _ = build_parser()
    args = parser.parse_args(["resolve", "--store", "sqlite:///x.db", *shlex.split(line)])
    assert (args.run, args.call, args.attempt) == (run_id, "c0.0", 0)
    if is_error:
        assert args.failed == returned
    else:
        assert json.loads(args.succeeded) == returned
