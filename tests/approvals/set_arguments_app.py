"""A worker app for test_set_arguments.py: a 1-of-1 gated tool whose arguments hold sets.

`SET_APP_DIR` names the directory holding `alice.key.pub`.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

import bide
from bide.approvals import ApprovalGate
from bide.testing import ScriptedModel, call, reply

TAGS = ["red", "green", "blue", "yellow", "cyan", "magenta", "black", "white", "grey", "pink"]


class Label(BaseModel):
    name: str
    aliases: frozenset[str]


gate = ApprovalGate.single("alice", os.path.join(os.environ["SET_APP_DIR"], "alice.key.pub"))


@bide.tool(gate=gate)
def tag(item: str, tags: set[str], label: Label, by_colour: dict[str, set[str]]) -> str:
    """Tag an item."""
    return f"tagged {item} with {sorted(tags)}"


def build(store: bide.Store) -> bide.Agent:
    arguments = {
        "item": "x",
        "tags": TAGS,
        "label": {"name": "l", "aliases": TAGS[::-1]},
        "by_colour": {"warm": ["red", "yellow", "pink", "magenta"], "cold": ["blue", "cyan", "grey"]},
    }
    return bide.Agent(ScriptedModel([call("tag", **arguments), reply("done")]), store=store, tools=[tag])
