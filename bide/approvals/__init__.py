"""bide.approvals: tools that wait for k of n signed human decisions.

- `ApprovalGate(policy)` (or `ApprovalGate.k_of_n(k, {name: public key})`, `ApprovalGate.single(name, key)`):
  give it to a tool (`@bide.tool(gate=...)`); the run pauses (`awaiting_approval`) until decided. It acts
  on a journaled tally only once its own recount of the signed decisions agrees (`ApprovalRecordsInvalid`
  otherwise: nothing runs).
- `ApprovalPolicy`, `Approver`: the fixed, named seats; one key per seat.
- `submit_decision(store, run_id, call_id, key, approve=...)`, `pending_approvals(store)`: the approver's side
  (also the `bide approve`, `bide deny` and `bide pending` commands); refusals raise `ApprovalRefused`
  (`NoWaitingCall` when there is no such waiting call).
- `count`: the counting rule, shared by the gate and the offline recount `verify_approvals`
  (`bide-audit verify-approvals`), which also binds the call that ran to the approval; `decision_bytes`
  and `journal_digest_of`: what an approver signs, bound to one journal by the digest of its header.
- `ApprovalTrust`: the policy an auditor pins (digest, approvers, k); a gate under another raises
  `UntrustedPolicy`.

Signed bytes and record layouts are documented in docs/audit.md.

The re-exports are lazy: `import bide.approvals` loads none of its submodules, and the first use of a name
imports the submodule that defines it, so the `bide` command line starts without the journal, pydantic and
cryptography. (Its exceptions are defined beside the code that raises them, which needs those libraries,
so they are not loaded up front as bide's and bide.audit's are.)
"""

from __future__ import annotations

import typing as _typing

from .._lazy import LazyExports as _LazyExports

if _typing.TYPE_CHECKING:  # type checkers and IDEs see the real objects; at run time `__getattr__` loads them
    from ._gate import ApprovalGate, ApprovalRecordsInvalid
    from ._policy import ApprovalPolicy, Approver, decision_bytes, journal_digest_of
    from ._submit import ApprovalRefused, NoWaitingCall, PendingApproval, pending_approvals, submit_decision
    from ._tally import Count, count
    from ._trust import ApprovalTrust, UntrustedPolicy
    from ._verify import verify_approvals

__all__ = [
    "ApprovalGate",
    "ApprovalPolicy",
    "ApprovalRecordsInvalid",
    "ApprovalRefused",
    "ApprovalTrust",
    "Approver",
    "Count",
    "NoWaitingCall",
    "PendingApproval",
    "UntrustedPolicy",
    "count",
    "decision_bytes",
    "journal_digest_of",
    "pending_approvals",
    "submit_decision",
    "verify_approvals",
]

# Where each public name is defined, submodule -> names (a test checks this against the imports above).
# fmt: off
_SUBMODULE_NAMES: dict[str, tuple[str, ...]] = {
    "_gate": ("ApprovalGate", "ApprovalRecordsInvalid"),
    "_policy": ("ApprovalPolicy", "Approver", "decision_bytes", "journal_digest_of"),
    "_submit": (
        "ApprovalRefused", "NoWaitingCall", "PendingApproval", "pending_approvals", "submit_decision",
    ),
    "_tally": ("Count", "count"),
    "_trust": ("ApprovalTrust", "UntrustedPolicy"),
    "_verify": ("verify_approvals",),
}
# fmt: on
_EXPORTS = _LazyExports(__name__, globals(), __all__, _SUBMODULE_NAMES)

# Hidden from type checkers: with a visible module `__getattr__`, mypy would accept any
# `bide.approvals.<typo>`.
if not _typing.TYPE_CHECKING:
    __getattr__ = _EXPORTS.load
__dir__ = _EXPORTS.names  # the loaded names and every public one, loaded or not
