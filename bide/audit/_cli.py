"""`bide-audit`: verify bide's audit artifacts offline; `export` is the one command that reads a store.

Exit codes are the table shared with `bide` and `govern` (`bide._cli_common`, printed by `--help`):
0 verified (or artifact written); 1 read and NOT verified; 2 usage error (a malformed store URL, a missing
-o or --anchor-dir directory, an output or anchored head that cannot be written: a full disk); 3 internal
error; 4 input unreadable (missing file, not JSON, malformed, wrong format, bad key file; no such store or
run for `export`; a different head already anchored under the same name); 5 refused: (verify-approvals)
the gates check out but under a policy other than the one pinned with --policy-digest, --approver, --need
or --policy; 6 (`export`) the store failed; 7 (`export --record`) not yet: the record was committed while
the export ran, after the journal it signs was read (nothing was written: run it again).
Every string taken from an input is printed through `bide._terminal.printable`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._cli_common import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_NOT_FOUND,
    EXIT_NOT_YET,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORE,
    EXIT_USAGE,
    Parser,
    add_standard_options,
    byte_limit,
    close_store,
    parse_arguments,
    skew_seconds,
    store_failure,
    unreadable_store,
)
from .._files import check_output, write_whole
from .._stdout import closed_stdout_fails, emitted
from .._terminal import printable
from ._errors import NotVerified, RecordPastHead, UnreadableInput

# The artifact formats (pydantic), the keys (cryptography) and the checks are imported by the commands that
# use them, not here: `bide-audit --help` and a usage error never pay for them.
if TYPE_CHECKING:
    from ._formats import SignedTreeHead
    from ._keys import PublicKey
    from ._log import AuditLog
    from ._verify import Verified

__all__ = ["main"]

#: `--max-input-bytes`' default: `bide.audit._strict.MAX_INPUT_BYTES`, written here so that the parser need
#: not import pydantic (a test checks that they agree).
MAX_INPUT_BYTES = 256 * 1024 * 1024

VERIFIED, NOT_VERIFIED, USAGE = EXIT_OK, EXIT_FAILED, EXIT_USAGE
INTERNAL, UNREADABLE, UNTRUSTED, STORE_FAILED = EXIT_INTERNAL, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_STORE
NOT_YET = EXIT_NOT_YET
INTERRUPTED = 130  # what shells report for a command that SIGINT (Ctrl-C) ended
_REASONS = {
    NOT_VERIFIED: "not verified",
    USAGE: "usage error",
    INTERNAL: "internal error",
    UNREADABLE: "unusable input",
    UNTRUSTED: "untrusted policy",
    STORE_FAILED: "store failed",
    NOT_YET: "not yet",
    INTERRUPTED: "interrupted",
}


def _read(path: str, limit: int) -> bytes:
    from ._input import read_limited

    try:
        data = read_limited(path, limit)
    except OSError as exc:
        raise UnreadableInput(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise UnreadableInput(f"{path} is over the {limit}-byte limit (--max-input-bytes)")
    return data


def _key(args: argparse.Namespace) -> PublicKey:
    from ._keys import load_public_key

    return load_public_key(args.pubkey)


def _key_or_why(args: argparse.Namespace) -> PublicKey | UnreadableInput:
    """The --pubkey key, or why it cannot be read (raised by the caller after checking what it can)."""
    try:
        return _key(args)
    except UnreadableInput as exc:
        return exc


def _key_if_given(args: argparse.Namespace, unreadable: list[UnreadableInput]) -> PublicKey | None:
    """The --pubkey key, when one is given and can be read; why it cannot goes to `unreadable`."""
    if not args.pubkey:
        return None
    found = _key_or_why(args)
    if isinstance(found, UnreadableInput):
        unreadable.append(found)
        return None
    return found


def _cmd_verify(args: argparse.Namespace) -> Verified:
    from ._formats import ProofBundle
    from ._strict import parse_artifact
    from ._verify import check_bundle_proofs, verify_bundle

    key = _key_or_why(args)
    bundle = parse_artifact(ProofBundle, _read(args.bundle, args.max_input_bytes), what=args.bundle)
    if isinstance(key, UnreadableInput):
        check_bundle_proofs(bundle)  # a forgery is reported (1) before the unreadable key (4)
        raise key
    return verify_bundle(bundle, key, max_skew_ns=args.max_clock_skew * 10**9)


def _cmd_verify_evidence(args: argparse.Namespace) -> Verified:
    from ._formats import EvidencePackage
    from ._strict import parse_artifact
    from ._verify import check_evidence_proofs, verify_evidence

    key = _key_or_why(args)
    pkg = parse_artifact(EvidencePackage, _read(args.package, args.max_input_bytes), what=args.package)
    if isinstance(key, UnreadableInput):
        check_evidence_proofs(pkg)  # a forgery is reported (1) before the unreadable key (4)
        raise key
    return verify_evidence(pkg, key, max_skew_ns=args.max_clock_skew * 10**9)


def _cmd_verify_consistency(args: argparse.Namespace) -> Verified:
    from ._formats import ConsistencyProof, SignedTreeHead, check_head
    from ._strict import parse_artifact
    from ._verify import verify_consistency_proof

    skew = args.max_clock_skew * 10**9
    heads: list[SignedTreeHead] = []
    unreadable: list[UnreadableInput] = []
    key = _key_if_given(args, unreadable)
    for path in (args.old_head, args.new_head):
        try:
            heads.append(parse_artifact(SignedTreeHead, _read(path, args.max_input_bytes), what=path))
        except UnreadableInput as exc:
            unreadable.append(exc)
    proof: ConsistencyProof | None = None
    try:
        proof = parse_artifact(ConsistencyProof, _read(args.proof, args.max_input_bytes), what=args.proof)
    except UnreadableInput as exc:
        unreadable.append(exc)
    if unreadable:
        # A forged head beside an unreadable file is reported as forged (exit 1 before exit 4); so are heads
        # and a proof that disagree beside an unreadable --pubkey (the hashes are checked without it).
        if key is not None:
            for head in heads:
                check_head(head, key, max_skew_ns=skew)
        elif len(heads) == 2 and proof is not None:
            verify_consistency_proof(heads[0], heads[1], proof, None, max_skew_ns=skew)
        raise unreadable[0]
    assert proof is not None
    return verify_consistency_proof(heads[0], heads[1], proof, key, max_skew_ns=skew)


def _cmd_verify_approvals(args: argparse.Namespace) -> Verified:
    from ..approvals._trust import ApprovalTrust
    from ..approvals._verify import verify_approvals
    from ._formats import EvidencePackage
    from ._strict import parse_artifact

    skew = args.max_clock_skew * 10**9
    # The pins and the key are read first, but an unreadable one only decides the exit code after the
    # package was checked as far as it can be without it: a forgery beside an unreadable key or policy file
    # is reported as forged (exit 1 before exit 4), as in verify-consistency.
    unreadable: list[UnreadableInput] = []
    trust: ApprovalTrust | None = None
    try:
        trust = ApprovalTrust.of(
            policy_digests=args.policy_digest,
            approvers=args.approver or None,
            need=args.need,
            policy_files=args.policy,
        )
    except UnreadableInput as exc:
        unreadable.append(exc)
    key = _key_if_given(args, unreadable)
    try:
        pkg = parse_artifact(EvidencePackage, _read(args.package, args.max_input_bytes), what=args.package)
    except UnreadableInput as exc:
        if not unreadable:
            raise
        # Nothing can be checked: name every unreadable input.
        raise UnreadableInput("; ".join(str(e) for e in (*unreadable, exc))) from exc
    if unreadable:
        # Without every pin there is no trust verdict: check the package's own proofs (and its head, under a
        # readable --pubkey) and recount its gates under no pin; NotVerified propagates (exit 1).
        verify_approvals(pkg, key, call_id=args.call, max_skew_ns=skew)
        raise UnreadableInput(
            f"{unreadable[0]} (the package was checked as far as it can be without it and shows no "
            "forgery, but nothing is verified until every input is readable)"
        ) from unreadable[0]
    return verify_approvals(pkg, key, call_id=args.call, trust=trust, max_skew_ns=skew)


def _write_atomic(
    path: Path, data: bytes, publisher: _RecordingPublisher | None = None, head: SignedTreeHead | None = None
) -> None:
    """Write `data` to `path`, all of it or nothing; with a `publisher`, publish `head` once the output is
    staged beside its name (a full disk is found before a head is anchored without its artifact)."""
    from .._errors import ConfigError

    publish = None if publisher is None or head is None else (lambda: publisher.publish(head))
    try:
        mode, owner = _replaced_access(path)
        write_whole(path, data, mode=mode, owner=owner, before_rename=publish)
    except OSError as exc:
        heads = publisher.published if publisher is not None else []
        sent = "".join(f"; its signed head ({n} records) was published to {p}" for n, p in heads)
        if publish is not None and not heads:
            sent = ", and nothing was published"
        why = exc.strerror or exc
        raise ConfigError(f"cannot write {path}: {why}; {path} was not written{sent}") from exc


def _replaced_access(path: Path) -> tuple[int, tuple[int, int] | None]:
    """The permission bits and (owner, group) to write the export `path` with: those of the file it
    replaces (where a symlink at `path` leads), which its owner chose (0640 root:auditors, say, for the
    auditors' group to read), less any write bit but the owner's and any execute bit (`_EXPORT_BITS`); 0600
    and this process's own for a new file, since evidence holds the journal's records."""
    try:
        found = os.stat(path)
    except OSError:  # no file there yet (a dangling link too): a new one
        return 0o600, None
    return stat.S_IMODE(found.st_mode) & _EXPORT_BITS, (found.st_uid, found.st_gid)


# What an export keeps of the mode of the file it replaces: who may read it, and its owner's write bit. A
# group or world write bit is not kept (0666 by a umask of 0, say): whoever holds it could swap the evidence
# for other bytes after the export; execute and set-id bits mean nothing on a JSON document.
_EXPORT_BITS = 0o644


def _store_files(path: str) -> list[str]:
    # SQLite keeps committed records in its -wal (and -journal) beside the main file: replacing any of them
    # loses the journal as surely as replacing the database. It names them after the file the path leads
    # to, which a symlink may name otherwise.
    names = (path, os.path.realpath(path))
    return [f"{name}{suffix}" for name in names for suffix in ("", "-wal", "-shm", "-journal")]


def _anchor_publisher(directory: str, output: Path) -> _RecordingPublisher:
    """The publisher of `export --anchor-dir`, once `directory` is known to exist and be writable: like
    `-o`, a missing directory is refused (exit 2), never created, so a typo in a path cannot scatter heads
    where no one looks for them; a head that cannot be written there (a full disk) is exit 2 too, before
    `output` is written."""
    from .._errors import ConfigError

    path = Path(directory)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist (create it first)"
        raise ConfigError(f"--anchor-dir {directory} {what}; nothing was published or written")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--anchor-dir {directory} is not writable; nothing was published or written")
    return _RecordingPublisher(path, output)


_ANCHOR_LOCK_WAIT_S = 30.0  # how long an export waits for another one publishing into its anchor directory


#: The file in an anchor directory that an export comparing and publishing there holds locked, made for the
#: while and removed after (hidden: not a head): `bide.audit._anchor.LOCK_FILE`, written here so that the
#: parser need not import pydantic (a test checks that they agree).
_ANCHOR_LOCK_FILE = ".bide-audit-export.lock"


class _RecordingPublisher:
    """A `DirectoryPublisher` that remembers where each head went (size, file), for the export message."""

    def __init__(self, directory: Path, output: Path) -> None:
        from ._anchor import DirectoryPublisher

        self.inner = DirectoryPublisher(directory)
        self.output = output
        self.published: list[tuple[int, Path]] = []
        self.notes: list[str] = []  # sentences for the export's message: what comparing with the heads found

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the anchor directory's locks meanwhile (`DirectoryPublisher.locked`, the lock file
        `_ANCHOR_LOCK_FILE` and the directory itself), waiting up to `_ANCHOR_LOCK_WAIT_S` for another
        export (or library publisher) to publish. When neither can be taken, a note says the heads were not
        guarded against an export at the same moment."""
        from .._errors import ConfigError
        from .._files import StillLocked

        with contextlib.ExitStack() as stack:
            try:
                locked = stack.enter_context(self.inner.locked(_ANCHOR_LOCK_WAIT_S))
            except StillLocked:
                raise ConfigError(
                    f"--anchor-dir {self.inner.directory} stayed locked by another export for "
                    f"{_ANCHOR_LOCK_WAIT_S:g} s (a paused or stuck `bide-audit export`); nothing was "
                    f"published, and {self.output} was not written: run it again"
                ) from None
            if not locked:
                self.notes.append(" The anchor directory could not be locked (neither a lock file in it nor "
                                  "the directory itself), so an export into it at the same moment was not "
                                  "kept from publishing between the two.")
            yield

    def refuse_forks(
        self, log: AuditLog, sth: SignedTreeHead, *, allow: bool, earlier_keys: Sequence[PublicKey] = ()
    ) -> None:
        """Raise ForkRefused (a NotVerified), before anything is written, when `sth` forks from a head of its
        log already anchored here (`DirectoryPublisher.compare`: the log's key, or one of its
        `earlier_keys`, would have signed two histories of one run), unless `allow`. Heads of the run
        signed by other keys are not compared: a note says so."""
        found = self.inner.compare(log, sth, earlier_keys=earlier_keys)
        if found.unreadable is not None:  # a drop box: writable, not readable
            self.notes.append(f" The heads already anchored there could not be read ({found.unreadable}), so "
                              "it was not compared with them.")
            return
        strangers = found.others
        if strangers:
            self.notes.append(
                f" Heads of the run anchored there signed by {len(strangers)} other key(s) "
                f"({', '.join(strangers[:3])}{', ...' if len(strangers) > 3 else ''}) were not compared with "
                "it: if the log's key was rotated, give its earlier public keys with --anchor-key."
            )
        if not found.forks:
            return
        if allow:
            self.notes.append(f" It forks from heads anchored there, published all the same (--allow-fork): "
                              f"{found.forks_in_words()}.")
            return
        raise found.refusal(
            nothing_done=f"Nothing was published, and {self.output} was not written",
            allow="pass --allow-fork",
            earlier="one given with --anchor-key",
        )

    def publish(self, sth: SignedTreeHead) -> None:
        """Publish `sth`; a head the directory cannot take (an OSError) is a ConfigError, as for `-o`."""
        from .._errors import ConfigError
        from ._anchor import AnchorError

        try:
            self.inner.publish(sth)
        except AnchorError as exc:
            cause = exc.__cause__
            if not isinstance(cause, OSError):  # a different head already there, or no directory: as before
                raise
            why = cause.strerror or cause
            raise ConfigError(
                f"cannot write the signed head to --anchor-dir {self.inner.directory} "
                f"({self.inner.path_for(sth)}): {why}; nothing was published, and {self.output} was not "
                "written"
            ) from exc
        self.published.append((sth.size, self.inner.path_for(sth)))


def _cmd_export(args: argparse.Namespace) -> Verified:
    from .._errors import ConfigError, StoreNotFound
    from .._open import open_store
    from .._url import parse_store_url
    from ._keys import load_public_key, load_signing_key
    from ._log import AuditLog, journal_shorter
    from ._verify import Verified

    if args.consistency_to is not None and args.consistency_from is None:
        raise ConfigError("--consistency-to needs --consistency-from SIZE (the size of the older head)")
    if args.allow_fork and not args.anchor_dir:
        raise ConfigError("--allow-fork needs --anchor-dir DIR (the heads it allows a fork from are there)")
    if args.anchor_key and not args.anchor_dir:
        raise ConfigError("--anchor-key needs --anchor-dir DIR (the heads it signed are compared there)")
    sizes = {"--consistency-from": args.consistency_from, "--consistency-to": args.consistency_to}
    for option, size in sizes.items():
        if size is not None and size < 0:
            raise ConfigError(
                f"{option} {size} is negative: a size is a number of records, 0 or more (the size a head "
                "states)"
            )
    if args.consistency_to is not None and args.consistency_to < args.consistency_from:
        raise ConfigError(
            f"--consistency-from {args.consistency_from} is larger than --consistency-to "
            f"{args.consistency_to}: the sizes are reversed; --consistency-from takes the older, smaller "
            f"head's size (--consistency-from {args.consistency_to} --consistency-to {args.consistency_from})"
        )
    where = parse_store_url(args.store)
    # Checked before the key is read, the store opened or a head published: a refused -o changes nothing.
    # The key's .pub is guarded too: it is what verifiers pin.
    keys = [args.key, args.key + ".pub", os.path.realpath(args.key) + ".pub"]  # .pub: beside the file itself
    inputs = [*keys, *args.anchor_key, *(_store_files(where.path) if where.kind == "sqlite" else [])]
    output = check_output(args.output, inputs=inputs)
    publisher = _anchor_publisher(args.anchor_dir, output) if args.anchor_dir else None
    progress: _ExportProgress = args.progress
    progress.output, progress.publisher = output, publisher
    key = load_signing_key(args.key)
    earlier_keys = [load_public_key(spec) for spec in args.anchor_key]
    # create=False: a mistyped URL (or table prefix) must not leave an empty store behind.
    try:
        store = open_store(args.store, table_prefix=args.table_prefix, create=False)
    except StoreNotFound as exc:
        if exc.missing != "tables":
            raise
        raise StoreNotFound(f"{exc}; give the store's own with --table-prefix", missing="tables") from exc
    try:
        log = AuditLog(store, key)  # its head is published here, once the artifact is made
        if store.runs(prefix=args.run, limit=1) != [args.run]:  # (the run sorts first among its prefix's)
            raise UnreadableInput(f"the store {args.store} has no run {args.run!r}")
        artifact: Any
        # Looked up before the journal is checked, so that a record found here is among the records checked
        # (a live run goes on meanwhile): one committed after the look-up is refused as not there yet.
        if args.record and store.get(args.run, args.record) is None:  # refused before a head is signed
            raise UnreadableInput(
                f"run {args.run!r} in the store {args.store} has no record {args.record!r}; "
                f"`bide show {args.run}` lists its record keys"
            )
        # Nothing is signed, proven or exported over a journal that is not the one its tree was built from,
        # nor over records appended since it was checked: the head is of the records checked.
        checked = log.check_journal(args.run)
        head: SignedTreeHead | None = None
        if args.consistency_from is not None:
            if args.consistency_to is None and args.consistency_from > checked:
                # Not a usage error: the older head's size is past the journal's end (records removed).
                raise journal_shorter(args.run, checked, args.consistency_from)
            to = checked if args.consistency_to is None else args.consistency_to
            if to > checked and args.consistency_from <= to:
                # The newer head you hold covers records the journal no longer holds: not a usage error.
                raise journal_shorter(args.run, checked, to)
            if to > checked:
                raise ConfigError(
                    f"run {args.run!r} has {checked} records; cannot prove {args.consistency_from} -> {to}"
                )
            artifact = log.consistency(args.run, args.consistency_from, to)
            what = f"a consistency proof {artifact.old_size} -> {artifact.new_size} for run {args.run!r}"
        else:
            head = log.sign_head(args.run, size=checked, publish=False)
            if args.head:
                artifact = head
                what = f"a signed head of run {args.run!r} at {artifact.size} records"
            elif args.record:
                try:
                    artifact = log.prove(args.run, args.record, head)
                except RecordPastHead as exc:  # (a commit the look-up saw before the journal's check did)
                    raise RecordPastHead(
                        f"record {args.record!r} of run {args.run!r} is not among the {checked} records "
                        "checked and signed: it was committed while the export ran. Nothing was signed, "
                        "published or written; run the export again to prove it"
                    ) from exc
                what = f"a proof bundle for record {args.record!r} of run {args.run!r}"
            else:
                artifact = log.evidence(args.run, head)
                what = f"an evidence package of all {len(artifact.records)} records of run {args.run!r}"
        data = progress.data = artifact.to_json()
        if publisher is not None and head is not None:
            # Compared and published under the directory's lock: two exports at once (of two copies of a
            # store, one edited) each compared with the heads there before the other's was published,
            # and both forking heads went in, neither refused.
            with publisher.exclusive():
                publisher.refuse_forks(log, head, allow=args.allow_fork, earlier_keys=earlier_keys)
                _write_atomic(output, data, publisher, head)  # published once it is staged
        else:
            _write_atomic(output, data, publisher, head)
    finally:
        close_store(store)
    anchored = ""
    if publisher is not None:
        sent = [f" Published its signed head ({n} records) to {path}." for n, path in publisher.published]
        anchored = "".join(sent + publisher.notes) or (
            f" No head was signed (a consistency proof needs none), so nothing was published to "
            f"{args.anchor_dir}."
        )
    return Verified(
        proven=f"Wrote {what} to {args.output}.{anchored}",
        not_proven="Nothing was verified; run a verify command on the file.",
    )


@dataclass
class _ExportProgress:
    """How far `export` got, for what an interrupt (Ctrl-C) says: its output, once checked, the bytes meant
    for it, once made, and the publisher of its head (`--anchor-dir`)."""

    output: Path | None = None
    data: bytes | None = None
    publisher: _RecordingPublisher | None = None

    def interrupted(self) -> str:
        """What an interrupt left: whether the output holds the export whole, and any head published."""
        heads = [] if self.publisher is None else self.publisher.published
        sent = "".join(f"; its signed head ({n} records) was published to {p}" for n, p in heads)
        if self.output is None:  # (not an export, or one interrupted before it checked its output)
            return "INTERRUPTED: nothing was left half-written"
        if self.data is not None and _holds(self.output, self.data):  # it came once the rename was done
            return f"INTERRUPTED: {self.output} was written: it holds the export, whole{sent}"
        return f"INTERRUPTED: {self.output} was not written (nothing was left half-written){sent}"


def _holds(path: Path, data: bytes) -> bool:
    """`path` holds exactly `data` (read back: the rename that writes it may or may not have happened)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


@dataclass
class _Interrupts:
    """SIGINT (Ctrl-C) in `bide-audit`: a KeyboardInterrupt while the command runs, remembered (`came`), so
    that an error wrapping it is still the interrupt (pydantic's serializer turns one raised in a function it
    calls into a PydanticSerializationError); once the outcome is `settled`, only remembered: what the
    command then prints is printed whole, and says what was done."""

    came: bool = False
    settled: bool = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.settled:
            return
        self.came = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def taken(self, *, restore: bool) -> Iterator[None]:
        """This object handles SIGINT in the block (in the main thread, which alone gets signals); after it,
        the handler before it again if `restore`, else none: SIGINT is ignored (the process is ending)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self)
        try:
            yield
        finally:
            # Ignored, not left to this handler: Python puts back the default for a handler of its own as it
            # exits, and a SIGINT then (freeing a large export takes a while) killed a command that had done
            # its work and said so.
            signal.signal(signal.SIGINT, previous if restore else signal.SIG_IGN)

    def run(self, fn: Callable[[argparse.Namespace], Verified], args: argparse.Namespace) -> Verified:
        """`fn(args)`, settling the outcome when it ends; any error that an interrupt caused, raised as the
        KeyboardInterrupt it was."""
        try:
            try:
                return fn(args)
            finally:
                self.settled = True  # (an assignment, not a call: no signal handler runs before it)
        except Exception as exc:
            if self.came or _wraps_an_interrupt(exc):
                raise KeyboardInterrupt from exc
            raise


def _wraps_an_interrupt(exc: BaseException) -> bool:
    """`exc` was raised from a KeyboardInterrupt (perhaps through other errors), or is pydantic's error for
    one raised in a function its serializer called ("Error calling function `b64`: KeyboardInterrupt: "),
    which keeps only its name."""
    seen: BaseException | None = exc
    for _ in range(10):  # a chain is a few errors long; a cycle must not hang the command
        if seen is None:
            return False
        serializing = type(seen).__name__ == "PydanticSerializationError"
        if isinstance(seen, KeyboardInterrupt) or (serializing and ": KeyboardInterrupt: " in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cmd_keygen(args: argparse.Namespace) -> Verified:
    from .._errors import ConfigError
    from ._keys import KeyFileExists, generate_key
    from ._verify import Verified

    try:
        key = generate_key(args.path, overwrite=args.force)
    except KeyFileExists as exc:
        raise ConfigError(f"{exc} (pass --force to replace it)") from exc
    return Verified(
        proven=f"Wrote signing key {key.key_id} to {args.path} (mode 0600) and its public key to "
        f"{args.path}.pub.",
        not_proven="Keep the private key away from the store's operator "
        "if heads are to prove anything against them.",
    )


def _parser() -> Parser:
    p = Parser(prog="bide-audit", description="Verify bide audit artifacts offline.")
    add_standard_options(p)
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    common.add_argument(
        "--max-input-bytes", type=byte_limit, default=MAX_INPUT_BYTES, help="refuse larger inputs (bytes)"
    )
    common.add_argument(
        "--max-clock-skew",
        type=skew_seconds,
        default=300,
        help="seconds a head may be dated in the future (default 300)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, parents=[common], **kw)
        return parser

    s = add("verify", help="verify a proof bundle for one record")
    s.add_argument("bundle")
    s.add_argument("--pubkey", required=True, help="the log's public key: PEM file or 64 hex characters")
    s.set_defaults(fn=_cmd_verify)

    s = add("verify-evidence", help="verify an evidence package for a run")
    s.add_argument("package")
    s.add_argument("--pubkey", required=True, help="the log's public key: PEM file or 64 hex characters")
    s.set_defaults(fn=_cmd_verify_evidence)

    s = add("verify-consistency", help="verify that one signed head extends another")
    s.add_argument("old_head")
    s.add_argument("new_head")
    s.add_argument("proof")
    s.add_argument("--pubkey", help="also check both heads' signatures under this key")
    s.set_defaults(fn=_cmd_verify_consistency)

    s = add("verify-approvals", help="recount every approval gate in an evidence package")
    s.add_argument("package")
    s.add_argument("--pubkey", help="also check the package's signed head under this key")
    s.add_argument("--call", help="check only this call id's gate")
    s.add_argument(
        "--policy-digest",
        action="append",
        default=[],
        metavar="HEX",
        help="trust only gates under this policy digest (repeatable, with --policy: any of those given)",
    )
    s.add_argument(
        "--approver",
        action="append",
        default=[],
        metavar="NAME=KEY",
        help="trust only gates whose approvers are exactly these (repeatable; KEY: 64 hex or a .pub file)",
    )
    s.add_argument("--need", type=int, metavar="K", help="trust only gates that need exactly K approvals")
    s.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FILE",
        help='trust only gates under the policy in FILE ({"need": k, "approvers": [{"name", "public_key"}]}; '
        "repeatable, with --policy-digest: any of those given)",
    )
    s.set_defaults(fn=_cmd_verify_approvals)

    s = add("export", help="write an evidence package (or bundle, head, consistency proof) from a store")
    s.add_argument("--store", required=True, help="store URL, e.g. sqlite:///bide.db")
    s.add_argument(
        "--table-prefix", default="bide_", help="SQL table prefix of the store, as bide's (default: bide_)"
    )
    s.add_argument("--run", required=True)
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--key", required=True, help="the log's signing key file (bide-audit keygen)")
    s.add_argument("--anchor-dir", help="also publish the signed head to this directory")
    s.add_argument(
        "--anchor-key",
        action="append",
        default=[],
        metavar="KEY",
        help="with --anchor-dir: also compare the heads anchored there signed by this earlier key of the log "
        "(before a rotation; repeatable; a .pub file or 64 hex characters)",
    )
    s.add_argument(
        "--allow-fork",
        action="store_true",
        help="with --anchor-dir: publish the head even when it forks from a head of the run anchored there",
    )
    kind = s.add_mutually_exclusive_group()
    kind.add_argument("--record", help="a proof bundle for the record under this key")
    kind.add_argument("--head", action="store_true", help="only a signed tree head")
    kind.add_argument(
        "--consistency-from", type=int, metavar="SIZE", help="a consistency proof from SIZE records to now"
    )
    s.add_argument(
        "--consistency-to",
        type=int,
        metavar="SIZE",
        help="with --consistency-from: prove up to SIZE records (the size of the newer head you hold), "
        "not to now, so records appended since do not matter",
    )
    s.set_defaults(fn=_cmd_export)

    s = add("keygen", help="create an Ed25519 signing key FILE (and FILE.pub), as `govern keygen FILE`")
    s.add_argument("path", metavar="FILE")
    s.add_argument("--force", action="store_true", help="replace existing key files")
    s.set_defaults(fn=_cmd_keygen)
    return p


def _emit(
    args: argparse.Namespace,
    code: int,
    result: str,
    text: str,
    extra: str = "",
    facts: dict[str, Any] | None = None,
    reason: str | None = None,
) -> int:
    def write() -> None:
        if args.json:
            # json.dumps escapes every control and non-ASCII character: nothing from an input acts on a
            # terminal. Keys are sorted, as every command's --json (docs/cli.md).
            doc = {"result": result, "exit_code": code, "message": text, "not_proven": extra, **(facts or {})}
            if code != VERIFIED:  # the word every command's failure carries (docs/cli.md)
                doc["reason"] = reason or _REASONS.get(code, result.replace("_", " "))
            print(json.dumps(doc, sort_keys=True, ensure_ascii=True))
        else:
            out = sys.stdout if code == VERIFIED else sys.stderr
            print(printable(text), file=out)
            if extra:
                print(printable(extra), file=out)

    return emitted(write, code)


def _caused_by_a_missing_file(exc: BaseException) -> bool:
    """`exc` was raised from (perhaps through other errors) a file that does not exist."""
    seen: BaseException | None = exc
    for _ in range(10):  # a chain is a few errors long; a cycle must not hang the command
        if seen is None:
            return False
        if isinstance(seen, FileNotFoundError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _usage_in_json(message: str) -> None:
    """The JSON document of arguments refused with `--json`."""
    _emit(argparse.Namespace(json=True), USAGE, "error", f"ERROR: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run `bide-audit`; returns (and exits with) the exit code."""
    closed_stdout_fails()
    args = parse_arguments(_parser(), argv, _usage_in_json)
    fn: Callable[[argparse.Namespace], Verified] = args.fn
    args.progress = progress = _ExportProgress()
    interrupts = _Interrupts()
    # Run as a program (`argv` None), an interrupt after the outcome was printed, as the process exits, must
    # not end it (with a traceback, or killed): the outcome printed is what was done.
    with interrupts.taken(restore=argv is not None):
        try:
            code = _outcome(args, fn, interrupts, progress)
        except KeyboardInterrupt:  # (only one that came as the command ended, before it was settled)
            code = _emit(args, INTERRUPTED, "interrupted", progress.interrupted())
    if argv is None:
        sys.exit(code)
    return code


def _outcome(
    args: argparse.Namespace,
    fn: Callable[[argparse.Namespace], Verified],
    interrupts: _Interrupts,
    progress: _ExportProgress,
) -> int:
    """Run the command `fn` and print its outcome; returns the exit code."""
    from .._errors import BideError, StoreError
    from ..approvals._trust import UntrustedPolicy

    try:
        done = interrupts.run(fn, args)
    except UntrustedPolicy as exc:
        code = _emit(args, UNTRUSTED, "untrusted_policy", f"NOT TRUSTED: {exc}")
    except NotVerified as exc:
        code = _emit(args, NOT_VERIFIED, "not_verified", f"NOT VERIFIED: {exc}")
    except RecordPastHead as exc:
        code = _emit(args, NOT_YET, "not_yet", f"NOT YET: {exc}")
    except UnreadableInput as exc:
        # A file that is not there is "not found", as bide and govern say (the same exit code).
        missing = "not found" if _caused_by_a_missing_file(exc) else None
        code = _emit(args, UNREADABLE, "unusable_input", f"UNREADABLE INPUT: {exc}", reason=missing)
    except StoreError as exc:
        damaged = unreadable_store(exc, getattr(args, "store", None))
        if damaged is not None:  # not 6: reading it again fails the same way, and a script retries 6
            said = f"ERROR: cannot use the store: {damaged}"
            code = _emit(args, UNREADABLE, "error", said, reason="unreadable")
        else:
            said = store_failure(exc, getattr(args, "store", None))
            code = _emit(args, STORE_FAILED, "error", f"ERROR: the store failed: {said}")
    except BideError as exc:
        code = _emit(args, USAGE if isinstance(exc, ValueError) else UNREADABLE, "error", f"ERROR: {exc}")
    except KeyboardInterrupt:  # files are written whole (a key pair both or neither): nothing half-written
        code = _emit(args, INTERRUPTED, "interrupted", progress.interrupted())
    except Exception as exc:  # a bug must never look like "verified" or "not verified"
        if args.debug:
            traceback.print_exception(exc)
        code = _emit(args, INTERNAL, "internal_error", f"INTERNAL ERROR: {type(exc).__name__}: {exc}")
    else:
        result = "verified" if args.command.startswith("verify") else "produced"
        code = _emit(args, VERIFIED, result, done.proven, done.not_proven, done.facts)
    return code


if __name__ == "__main__":
    main()
