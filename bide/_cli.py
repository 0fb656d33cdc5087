"""The `bide` command line: inspect runs and resolve halts in a store.

    bide runs    [--store URL] [--prefix P] [--limit N] [--json]
    bide show    [--store URL] RUN [--json]
    bide resolve [--store URL] RUN CALL (--succeeded JSON | --failed MESSAGE | --not-started)
                 [--evidence JSON]
    bide worker  [--store URL] --app module:attribute [--concurrency N] [--poll S] [--once [--json]]
    bide cancel  [--store URL] RUN [--reason TEXT]

`--store` defaults to $BIDE_STORE, else sqlite:///bide.db. Exit codes: 0 done; 2 bad usage; 3 no such store,
run or call; 4 refused (the message says why and what to do); 5 the store failed.

Run ids, inputs, answers, record keys and every other string from the store are printed through
`printable` (control characters shown as escapes); `--json` output is ASCII-escaped JSON.

Extending: a module may add subcommands with `register(subparsers)`; each subcommand sets
`handler=fn(args) -> int` with `set_defaults`. `bide.approvals._cli.register` is picked up when present.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import BideError, ConfigError, NoLiveAttempt, ResolveRefused, StoreError
from ._journal import Journal
from ._open import open_store
from ._outcome import Outcome
from ._resolve import resolve_halt, status_of
from ._store import Store
from ._terminal import printable
from ._when import iso, when

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_STORE",
    "add_store_argument",
    "build_parser",
    "main",
    "open_cli_store",
    "say",
]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_STORE = 5
EXTENSIONS = ("bide.approvals._cli", "bide._worker_cli")


class CLIError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the shared --store option to a subcommand."""
    parser.add_argument(
        "--store",
        default=os.environ.get("BIDE_STORE", "sqlite:///bide.db"),
        help="store URL (default: $BIDE_STORE or sqlite:///bide.db)",
    )
    parser.add_argument("--table-prefix", default="bide_", help="SQL table prefix (default: bide_)")


def open_cli_store(args: argparse.Namespace) -> Store:
    """Open the store named by --store, refusing a SQLite file that does not exist (no silent creation)."""
    url: str = args.store
    if url.startswith("sqlite:"):
        path = url.split("sqlite:///", 1)[-1] if "sqlite:///" in url else ""
        if not path or not os.path.exists(path):
            raise CLIError(
                f"no SQLite store at {path or url!r}; pass --store sqlite:///path/to/bide.db", EXIT_NOT_FOUND
            )
    if url.startswith("memory:"):
        raise CLIError(
            "a memory:// store lives inside one process; the CLI needs sqlite:/// or postgresql://",
            EXIT_USAGE,
        )
    try:
        return open_store(url, table_prefix=args.table_prefix)
    except ConfigError as exc:
        raise CLIError(str(exc), EXIT_USAGE) from exc
    except Exception as exc:
        raise CLIError(f"cannot open store {url}: {exc}", EXIT_STORE) from exc


def _print_json(value: Any) -> None:
    # ASCII-escaped: a control character (C1, bidi override) from the store reaches no terminal.
    print(json.dumps(value, indent=2, sort_keys=True))


def say(text: str, *, file: Any = None) -> None:
    """Print one line built from store data, with control characters shown as escapes."""
    print(printable(text), file=file)


def _cmd_runs(args: argparse.Namespace) -> int:
    store = open_cli_store(args)
    try:
        rows: list[dict[str, Any]] = []
        after = ""
        while len(rows) < args.limit:
            batch = store.runs(prefix=args.prefix, after=after, limit=min(500, args.limit - len(rows)))
            if not batch:
                break
            for run_id in batch:
                st = status_of(Journal(store, run_id).load())
                rows.append(
                    {
                        "run_id": run_id,
                        "status": st.status,
                        "records": st.records,
                        "call_id": st.call_id,
                        "tool": st.tool,
                    }
                )
            after = batch[-1]
    finally:
        store.close()
    if args.json:
        _print_json(rows)
    else:
        for row in rows:
            extra = f"  call {row['call_id']} ({row['tool']})" if row["call_id"] else ""
            fields = (row["run_id"], row["status"], f"{row['records']} records{extra}")
            print("\t".join(printable(str(f)) for f in fields))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    store = open_cli_store(args)
    try:
        journal = Journal(store, args.run).load()
        if not journal.exists:
            raise CLIError(f"run {args.run!r} does not exist in {args.store}", EXIT_NOT_FOUND)
        st = status_of(journal)
        records = [{"seq": e.seq, "key": e.key, "record": json.loads(e.data)} for e in journal.entries()]
    finally:
        store.close()
    info = {
        "run_id": st.run_id,
        "status": st.status,
        "input": st.input,
        "answer": st.answer,
        "call_id": st.call_id,
        "tool": st.tool,
        "arguments": st.arguments,
    }
    if args.json:
        _print_json({"run": info, "records": records})
        return EXIT_OK
    say(f"run {st.run_id}: {st.status}")
    if st.input is not None:
        say(f"  input:  {st.input}")
    if st.answer is not None:
        say(f"  answer: {st.answer}")
    if st.call_id:
        say(f"  blocked on call {st.call_id}: {st.tool} {json.dumps(st.arguments, sort_keys=True)}")
        attempts = [r["record"] for r in records if r["record"].get("kind") == "attempt"]
        if st.status == "halted" and attempts:
            last = attempts[-1]
            deadline = last["deadline_ms"] / 1000
            say(
                f"  attempted {when(last['attempted_at_ms'] / 1000)}; deadline {when(deadline)}; "
                f"bide resolve accepts an outcome from {when(deadline + args.clock_skew)} on "
                f"(--clock-skew {args.clock_skew:g})"
            )
    for r in records:
        rec = r["record"]
        detail = {k: v for k, v in rec.items() if k not in ("key", "kind", "salt")}
        for name in ("attempted_at_ms", "deadline_ms"):
            if isinstance(detail.get(name), int):  # readable in text; --json keeps the stored numbers
                detail[name.removesuffix("_ms")] = iso(detail.pop(name) / 1000)
        say(
            f"  {r['seq']:>6}  {r['key']:<28} {rec.get('kind')}  {json.dumps(detail, sort_keys=True)[:160]}"
        )
    return EXIT_OK


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CLIError(f"{what} must be JSON (quote strings: '\"ok\"'): {exc}", EXIT_USAGE) from exc


def _cmd_resolve(args: argparse.Namespace) -> int:
    evidence = _json_arg(args.evidence, "--evidence") if args.evidence is not None else None
    if args.succeeded is not None:
        outcome = Outcome.succeeded(_json_arg(args.succeeded, "--succeeded"), evidence=evidence)
    elif args.failed is not None:
        outcome = Outcome.failed(args.failed, evidence=evidence)
    else:
        outcome = Outcome.not_started(evidence=evidence)
    store = open_cli_store(args)
    try:
        resolve_halt(store, args.run, args.call, outcome=outcome, clock_skew=args.clock_skew)
    finally:
        store.close()
    say(f"resolved call {args.call} of run {args.run} as {outcome.kind}; run the agent again to go on")
    return EXIT_OK


def build_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subparsers object (extensions add subcommands to the latter)."""
    parser = argparse.ArgumentParser(prog="bide", description="Inspect durable bide runs and resolve halts.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("runs", help="list runs and their status")
    add_store_argument(p)
    p.add_argument("--prefix", default="", help="only run ids starting with this")
    p.add_argument("--limit", type=int, default=1000, help="at most this many runs (default 1000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_cmd_runs)

    p = sub.add_parser("show", help="show a run's status and journal")
    add_store_argument(p)
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true", help="print JSON (records decoded)")
    p.add_argument(
        "--clock-skew", type=float, default=1.0, help="the margin bide resolve will use (for the times shown)"
    )
    p.set_defaults(handler=_cmd_show)

    p = sub.add_parser("resolve", help="record the outcome of a halted side-effect call")
    add_store_argument(p)
    p.add_argument("run", help="run id")
    p.add_argument("call", help="call id named by the halt (e.g. c0.0)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--succeeded", metavar="JSON", help="the effect happened; JSON result for the model")
    what.add_argument("--failed", metavar="MESSAGE", help="the effect did not happen; do not retry")
    what.add_argument("--not-started", action="store_true", help="the effect did not happen; retry it")
    p.add_argument("--evidence", metavar="JSON", help="JSON evidence journaled with the resolution")
    p.add_argument("--clock-skew", type=float, default=1.0, help="seconds to wait past the deadline")
    p.set_defaults(handler=_cmd_resolve)

    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue
            raise
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    return parser, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bide` console script; returns the exit code."""
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except CLIError as exc:
        say(f"bide: {exc}", file=sys.stderr)
        return exc.code
    except NoLiveAttempt as exc:
        say(f"bide: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except ResolveRefused as exc:
        say(f"bide: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ConfigError as exc:
        say(f"bide: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        say(f"bide: store error: {exc}", file=sys.stderr)
        return EXIT_STORE
    except BideError as exc:
        say(f"bide: {exc}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    raise SystemExit(main())
