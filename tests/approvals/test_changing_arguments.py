"""A gated tool whose arguments validate differently on each drive (a default_factory making a uuid) can
never be approved: the approvers sign the first drive's arguments. The pause, `bide pending` (through
`pending_approvals`) and `bide approve` say so, name the likely cause and what to do, instead of waiting
for approvals that already came."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

import bide
from bide.approvals import ApprovalGate, pending_approvals, submit_decision
from bide.audit import generate_key
from bide.testing import ScriptedModel, call, reply

from .conftest import RealStore
from .helpers import bide_cli

pytestmark = pytest.mark.slow


def test_arguments_that_change_between_drives_are_named_as_the_reason_a_call_waits(
    real_store: Callable[[str], RealStore], tmp_path: Path
) -> None:
    keys = {n: generate_key(tmp_path / f"{n}.key") for n in ("alice", "bob", "carol")}
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in keys.items()})
    fired: list[int] = []

    @bide.tool(gate=gate)
    def wire(
        amount: int, to: str, request_id: Annotated[str, Field(default_factory=lambda: uuid.uuid4().hex)]
    ) -> str:
        """Wire money."""
        fired.append(amount)
        return f"sent {amount} to {to}"

    s = real_store("s")

    def drive() -> bide.ApprovalPending:
        model = ScriptedModel([call("wire", amount=100, to="acme"), reply("done")])
        with pytest.raises(bide.ApprovalPending) as paused:
            bide.Agent(model, store=s.store, tools=[wire]).run_sync("inv", "pay")
        return paused.value

    assert "has 0; waiting for alice, bob, carol" in drive().reason
    for name in ("alice", "carol"):
        submit_decision(s.store, "inv", "c0.0", keys[name], approve=True)
    for _ in range(2):
        reason = drive().reason
        assert "the arguments of call 'c0.0' changed between drives" in reason
        assert "default_factory" in reason and "must validate the same way every time" in reason
        assert "bide cancel inv" in reason
    assert fired == []
    changed = [e.key for e in s.store.load("inv") if e.key.startswith("approval:changed:")]
    assert changed == ["approval:changed:c0.0"]  # journaled once, not on every drive

    [waiting] = pending_approvals(s.store)
    assert waiting.approved_by == ["alice", "carol"]  # what they signed: the first drive's arguments
    assert any("a drive validated the arguments of call 'c0.0'" in note for note in waiting.notes)
    shown = bide_cli("pending", *s.cli, cwd=tmp_path)
    assert shown.returncode == 0 and "Note on inv c0.0: a drive validated the arguments" in shown.stdout
    listed = bide_cli("pending", *s.cli, "--json", cwd=tmp_path)
    [entry] = json.loads(listed.stdout)
    assert any("no approval can count" in note for note in entry["approval"]["notes"])
    bob = bide_cli("approve", *s.cli, "inv", "c0.0", "--key", "bob.key", cwd=tmp_path)
    assert bob.returncode == 0, bob.stderr
    assert "Note: a drive validated the arguments of call 'c0.0'" in bob.stdout
    again = bide_cli("approve", *s.cli, "inv", "c0.0", "--key", "alice.key", cwd=tmp_path)
    assert again.returncode == 5
    assert "already decided" in again.stderr and "a drive validated the arguments" in again.stderr
