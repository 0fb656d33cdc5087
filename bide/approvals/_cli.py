"""The approver's commands of the `bide` CLI: `bide approve`, `bide deny` (`bide pending` lists the calls).

Exit codes are the shared table (`bide._cli_common`): 0 done; 2 usage (or a key file that holds no key); 4 no
such store, key file, run or waiting call; 5 refused (gate closed, key holds no seat, already decided); 6 the
store failed; 130 interrupted (and the message says whether the decision was sent).
"""

from __future__ import annotations

import argparse
import errno
import shlex
import sys
from typing import TYPE_CHECKING, Any

from .._cli_common import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_USAGE, give_up_on, run_id_argument, text_argument
from .._store import Store

if TYPE_CHECKING:
    from ._submit import PendingApproval

__all__ = ["register"]


def _fail(message: str, code: int) -> int:
    _say(f"bide: {message}", file=sys.stderr)
    return code


def _say(text: str, file: Any = None) -> None:
    from .._terminal import printable

    print(printable(text), file=file)


def _open(args: argparse.Namespace) -> Store | int:
    from .._cli import open_store_or_exit_code

    return open_store_or_exit_code(args)


def _decide(args: argparse.Namespace, approve: bool) -> int:
    from .._cli import EXIT_INTERRUPTED, StoppedWaiting, close_after_answer, interrupts_around_a_write
    from ..audit._errors import UnreadableInput
    from ..audit._keys import load_signing_key
    from ._submit import ApprovalRefused, NoWaitingCall, submit_decision

    try:
        key = load_signing_key(args.key)
    except UnreadableInput as exc:
        # A key file that is not there is a missing input (4); one that is there but holds no usable key is
        # a usage error (2), as in `govern` (docs/cli.md), however large (read_small_file's EFBIG).
        cause = exc.__cause__
        missing = isinstance(cause, OSError) and cause.errno != errno.EFBIG
        return _fail(str(exc), EXIT_NOT_FOUND if missing else EXIT_USAGE)
    store = _open(args)
    if isinstance(store, int):
        return store
    verb = "approval" if approve else "denial"
    with interrupts_around_a_write(f"the signed {verb} of call {args.call} in run {args.run}") as sending:
        abandoned = False
        try:
            record = submit_decision(store, args.run, args.call, key, approve=approve, sending=sending)
            left = _still_waiting(store, args.run, args.call)
        except KeyboardInterrupt:  # before the decision was sent
            give_up_on(store)
            return _fail(f"interrupted; no {verb} was sent for call {args.call} in run {args.run}",
                         EXIT_INTERRUPTED)
        except StoppedWaiting:
            abandoned = True
            return _fail(
                f"stopped waiting: the {verb} of call {args.call} in run {args.run} may or may not have been "
                f"recorded; `bide pending` or `bide show {shlex.quote(args.run)}` tells",
                EXIT_INTERRUPTED,
            )
        except NoWaitingCall as exc:
            return _fail(str(exc), EXIT_NOT_FOUND)
        except ApprovalRefused as exc:
            return _fail(f"refused: {exc}", EXIT_REFUSED)
        finally:
            if not abandoned:
                close_after_answer(store)
    _say(f"Recorded the signed {verb} as {record!r} in run {args.run!r}.")
    if isinstance(left, str):
        _say(f"bide: {left}", file=sys.stderr)
    elif left:
        p = left[0]
        # Once enough have decided, the gate waits for nobody, whoever has not spoken.
        waiting = (
            f"waiting for {', '.join(p.waiting_for) or 'nobody'}."
            if p.outcome == "pending"
            else f"that is enough: the gate will count the call {p.outcome}; no one else need decide."
        )
        _say(
            f"Call {p.call_id} needs {p.need} of {len(p.approvers)}: approved by "
            f"{', '.join(p.approved_by) or 'nobody'}, denied by {', '.join(p.denied_by) or 'nobody'}; "
            f"{waiting}"
        )
        for note in p.notes:
            _say(f"Note: {note}.")
    print("Run the agent again (same run id and input) so its gate counts the decisions and the run goes on.")
    return 0


def _still_waiting(store: Store, run_id: str, call_id: str) -> list[PendingApproval] | str:
    """What the call still waits for, read from this run's journal alone; or, when it cannot be read, why
    (the decision is recorded by then: a failed read afterwards is said, never made the command's failure)."""
    from .._errors import BideError
    from .._journal import Journal
    from ._submit import pending_in

    try:
        waiting = pending_in(Journal(store, run_id).load(), call_id=call_id)
    except BideError as exc:
        return (
            f"could not read what call {call_id} still waits for ({exc}); `bide pending` or `bide show "
            f"{shlex.quote(run_id)}` tells"
        )
    return [p for p in waiting if p.call_id == call_id]


def _approve(args: argparse.Namespace) -> int:
    return _decide(args, True)


def _deny(args: argparse.Namespace) -> int:
    return _decide(args, False)


def register(subparsers: Any) -> None:
    """Add `approve` and `deny` to `bide`'s subparsers; each sets `handler(args) -> int`."""
    from .._cli import add_store_argument

    for name, fn, what in (
        ("approve", _approve, "sign and record an approval"),
        ("deny", _deny, "sign and record a denial"),
    ):
        s = subparsers.add_parser(name, help=f"{what} of a call waiting at an approval gate")
        add_store_argument(s)
        s.add_argument("run", type=run_id_argument, help="run id")
        s.add_argument("call", type=text_argument, help="call id (see `bide pending`)")
        s.add_argument("--key", required=True, help="your Ed25519 signing key file (bide-audit keygen)")
        s.set_defaults(handler=fn)
