"""examples/recover.py runs as documented, and the `bide` CLI works end to end through subprocesses."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bide
from bide.testing import ScriptedModel, call, reply

ROOT = Path(__file__).resolve().parents[2]


def test_recover_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "recover.py")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "the charge was replayed, not redone" in out.stdout
    assert "resume halted: run=order-2 call=c0.0 tool=charge_card" in out.stdout
    assert "resolved c0.0 as succeeded" in out.stdout
    assert "status of order-2: completed" in out.stdout


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", *args], capture_output=True, text=True, timeout=60
    )


def clis(*calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """`cli(*args)` for each of `calls`, all at once (the same CPU work; a free core makes it faster)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: cli(*args), calls))


def test_cli_runs_show_resolve_and_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)

    @bide.tool(timeout=30)
    def send(to: str) -> str:
        """Send."""
        raise OSError("network unreachable after the request went out")

    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("done-1", "hello")
    # The sender's clock runs a minute behind: the deadline the call's marker records has passed already on
    # the wall clock (the resolve below allows no clock skew), while the call had all its 30 s to start (a
    # short timeout, waited out, could close before the marker's commit and a worker thread let it start).
    model = ScriptedModel([call("send", to="x"), reply("ok")])
    sender = bide.Agent(model, store=store, tools=[send], clock=lambda: time.time() - 60)
    with contextlib.suppress(bide.OutcomeUnknown):
        sender.run_sync("stuck-1", "send it")
    store.close()

    # The queries and refusals read the store only: they run at once, each in its own process.
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    runs, text, halted, bad_status, show, full, nope, no_store, bad_json, no_call, bogus = clis(
        ("runs", "--store", url, "--json"),
        ("runs", "--store", url),
        ("runs", "--store", url, "--status", "halted", "--json"),
        ("runs", "--store", url, "--status", "stuck"),
        ("show", "--store", url, "stuck-1"),
        ("show", "--store", url, "stuck-1", "--json"),
        ("show", "--store", url, "nope"),
        ("show", "--store", missing, "x"),
        ("resolve", "--store", url, "stuck-1", "c0.0", "--succeeded", "not json"),
        ("resolve", "--store", url, "stuck-1", "c9.9", "--not-started"),
        ("bogus",),
    )
    assert runs.returncode == 0, runs.stderr
    listed = json.loads(runs.stdout)
    # most recent activity first: the halted run has an attempt time, the answered one none
    assert [(r["run_id"], r["status"]) for r in listed] == [("stuck-1", "halted"), ("done-1", "completed")]
    assert listed[0]["last_activity"].endswith("Z") and listed[0]["last_record"].startswith("attempt:c0.0")
    assert "stuck-1" in text.stdout and "halted at c0.0 (send)" in text.stdout and " ago)" in text.stdout
    assert [r["run_id"] for r in json.loads(halted.stdout)] == ["stuck-1"]
    assert bad_status.returncode == 2
    assert show.returncode == 0 and "blocked on call c0.0: send" in show.stdout
    # Times are readable: ISO 8601 and how far away.
    assert "bide resolve accepts an outcome from 20" in show.stdout and " ago)" in show.stdout
    assert json.loads(full.stdout)["run"]["status"] == "halted"
    assert json.loads(full.stdout)["records"][-1]["key"].startswith("attempt:c0.0")
    assert nope.returncode == 4
    assert no_store.returncode == 4
    assert not (tmp_path / "missing.db").exists()
    assert bad_json.returncode == 2 and "JSON" in bad_json.stderr
    assert no_call.returncode == 4
    assert bogus.returncode == 2
    ok = cli(
        "resolve",
        "--store",
        url,
        "stuck-1",
        "c0.0",
        "--failed",
        "bounced",
        "--evidence",
        '{"ticket": 7}',
        "--clock-skew",
        "0",
    )
    assert ok.returncode == 0, ok.stderr
    again = cli("resolve", "--store", url, "stuck-1", "c0.0", "--succeeded", '"sent"', "--clock-skew", "0")
    assert again.returncode == 5 and "already has an outcome" in again.stderr

    store = bide.open_store(url)
    model = ScriptedModel([call("send", to="x"), reply("ok")])
    assert bide.Agent(model, store=store, tools=[send]).run_sync("stuck-1", "send it").answer == "ok"
    assert model.requests[0].messages[-1].content == "bounced"  # type: ignore[union-attr]
    store.close()


def test_console_script_installed() -> None:
    import shutil

    exe = shutil.which("bide")
    if exe is None:  # editable installs put it next to the interpreter
        exe = str(Path(sys.executable).with_name("bide"))
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "resolve" in out.stdout
