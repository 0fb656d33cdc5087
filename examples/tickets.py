"""A ticket approval workflow: a ticket needs both the lead's and security's approval.

The lead and security approve concurrently, in either order (a declared independent pair the build
checks). A ticket can only be approved with both approvals, and a rejection clears approvals; the
invariants repair any state that breaks those rules, in priority order.
"""

from __future__ import annotations

from govern import Registry

registry = Registry("tickets")
status = registry.enum("status", ["open", "in_review", "approved", "rejected", "closed"])
lead = registry.bool("lead_ok")
security = registry.bool("security_ok")

registry.invariant(
    "approval_needs_both", holds=(status != "approved") | (lead & security), repair={status: "in_review"}
)
registry.invariant(
    "rejection_clears_approvals",
    holds=(status != "rejected") | ~(lead | security),
    repair={lead: False, security: False},
)

registry.event("submit", guard=status == "open", effect={status: "in_review"})
registry.event("lead_approves", guard=status == "in_review", effect={lead: True})
registry.event("security_approves", guard=status == "in_review", effect={security: True})
registry.event("approve", guard=(status == "in_review") & lead & security, effect={status: "approved"})
registry.event("reject", guard=status == "in_review", effect={status: "rejected"})
registry.event("close", guard=status.isin(["approved", "rejected"]), effect={status: "closed"})
registry.independent("lead_approves", "security_approves")

if __name__ == "__main__":
    machine = registry.build()
    print(machine.report.text(witnesses=False))
    print()
    done = machine.replay(["submit", "security_approves", "lead_approves", "approve", "close"])
    print("submit, both approve, approve, close ->", dict(done))
