"""examples/recover.py runs as documented, and the `bide` CLI works end to end through subprocesses."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
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


def test_cli_runs_show_resolve_and_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)

    @bide.tool(timeout=0.3)  # room for the marker's commit: the call starts only inside its window
    def send(to: str) -> str:
        """Send."""
        raise OSError("network unreachable after the request went out")

    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("done-1", "hello")
    with contextlib.suppress(bide.OutcomeUnknown):
        bide.Agent(ScriptedModel([call("send", to="x"), reply("ok")]), store=store, tools=[send]).run_sync(
            "stuck-1", "send it"
        )
    store.close()

    runs = cli("runs", "--store", url, "--json")
    assert runs.returncode == 0, runs.stderr
    listed = json.loads(runs.stdout)
    # most recent activity first: the halted run has an attempt time, the answered one none
    assert [(r["run_id"], r["status"]) for r in listed] == [("stuck-1", "halted"), ("done-1", "completed")]
    assert listed[0]["last_activity"].endswith("Z") and listed[0]["last_record"].startswith("attempt:c0.0")
    text = cli("runs", "--store", url)
    assert "stuck-1" in text.stdout and "halted at c0.0 (send)" in text.stdout and " ago)" in text.stdout
    halted = cli("runs", "--store", url, "--status", "halted", "--json")
    assert [r["run_id"] for r in json.loads(halted.stdout)] == ["stuck-1"]
    assert cli("runs", "--store", url, "--status", "stuck").returncode == 2
    show = cli("show", "--store", url, "stuck-1")
    assert show.returncode == 0 and "blocked on call c0.0: send" in show.stdout
    # Times are readable: ISO 8601 and how far away.
    assert "bide resolve accepts an outcome from 20" in show.stdout and " ago)" in show.stdout
    full = json.loads(cli("show", "--store", url, "stuck-1", "--json").stdout)
    assert full["run"]["status"] == "halted" and full["records"][-1]["key"].startswith("attempt:c0.0")
    assert cli("show", "--store", url, "nope").returncode == 4
    assert cli("show", "--store", f"sqlite:///{tmp_path / 'missing.db'}", "x").returncode == 4
    assert not (tmp_path / "missing.db").exists()
    bad_json = cli("resolve", "--store", url, "stuck-1", "c0.0", "--succeeded", "not json")
    assert bad_json.returncode == 2 and "JSON" in bad_json.stderr
    assert cli("resolve", "--store", url, "stuck-1", "c9.9", "--not-started").returncode == 4
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
    assert cli("bogus").returncode == 2

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
