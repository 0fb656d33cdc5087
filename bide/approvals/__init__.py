"""bide.approvals: tools that wait for k of n signed human decisions.

- `ApprovalGate(policy)` (or `ApprovalGate.k_of_n(k, {name: public key})`, `ApprovalGate.single(name, key)`):
  give it to a tool (`@bide.tool(gate=...)`); the run pauses (`awaiting_approval`) until decided.
- `ApprovalPolicy`, `Approver`: the fixed, named seats; one key per seat.
- `submit_decision(store, run_id, call_id, key, approve=...)`, `pending_approvals(store)`: the approver's side
  (also the `bide approve`, `bide deny` and `bide pending` commands); refusals raise `ApprovalRefused`
  (`NoWaitingCall` when there is no such waiting call).
- `count`: the counting rule, shared by the gate and the offline recount `verify_approvals`
  (`bide-audit verify-approvals`), which also binds the call that ran to the approval.
- `ApprovalTrust`: the policy an auditor pins (digest, approvers, k); a gate under another raises
  `UntrustedPolicy`.

Signed bytes and record layouts are documented in docs/audit.md.
"""

from __future__ import annotations

from ._gate import ApprovalGate
from ._policy import ApprovalPolicy, Approver, decision_bytes
from ._submit import ApprovalRefused, NoWaitingCall, PendingApproval, pending_approvals, submit_decision
from ._tally import Count, count
from ._trust import ApprovalTrust, UntrustedPolicy
from ._verify import verify_approvals

__all__ = [
    "ApprovalGate",
    "ApprovalPolicy",
    "ApprovalRefused",
    "ApprovalTrust",
    "Approver",
    "Count",
    "NoWaitingCall",
    "PendingApproval",
    "UntrustedPolicy",
    "count",
    "decision_bytes",
    "pending_approvals",
    "submit_decision",
    "verify_approvals",
]

# Public classes report their public path (bide.approvals.X) in reprs and tracebacks.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("bide.approvals._"):
        _obj.__module__ = "bide.approvals"
del _name, _obj
