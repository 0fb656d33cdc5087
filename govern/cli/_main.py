"""The `govern` command: certify machines in CI, check certificates offline, show, graph, keygen.

Exit codes are the table shared with `bide` and `bide-audit` (`bide._cli_common.EXIT_CODES_HELP`, printed
by `govern --help`); govern uses:

    0  success: certified / the certificate is valid
    1  not convergent (certify: a counterexample is printed) / read, and not valid (check)
    2  usage or input error: bad arguments, a machine file that does not import, no registry found, an
       unusable key, an output file that cannot be written or named (a name too long: nothing is left
       half-written)
    3  engine/oracle disagreement or internal error (a bug: please report it)
    4  unreadable or not found: a certificate that is truncated, oversized, malformed, not canonical
       (check, show, graph); an input file (machine file, certificate, key) that is missing or unreadable,
       or a machine file over --max-size

Every string taken from a certificate, a machine or an error is printed through `_safe` (the shared
sanitizer `bide._terminal.printable`, then rich markup escaping); --json output is ASCII-escaped JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar, cast

from bide._cli_common import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    UsageRefused,
    add_standard_options,
    byte_limit,
    skew_seconds,
)
from bide._stdout import (
    GuardedStdout,
    WrappedStream,
    closed_stdout_fails,
    emitted,
    ended,
    informational_exit,
    silence_stdout,
)
from bide._terminal import printable

from .._errors import GovernError, shown
from ..certificate._errors import (
    CertificateInvalid,
    CertificateTooLarge,
    CertificateUnreadable,
    KeyFileUnreadable,
    SigningKeyError,
)
from ._paths import (
    InputFileUnreadable,
    UsageError,
    input_file_size,
    is_directory,
    is_other_than_file,
    refuse_overwriting,
    unreadable_input,
)

# The certificate modules (numpy, pydantic, cryptography) and rich are imported by the commands that use
# them, not here: `govern --help` and a usage error never pay for them.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..certificate._certificate import Certificate, CheckResult
    from ..certificate._composed import ComposedCertificate, ComposedCheckResult
    from ..certificate._symbolic import SymbolicCertificate
    from ..machine._registry import Registry

    #: What `govern certify` writes: a table certificate, a composed one, or a symbolic one (no tables).
    AnyCertificate = Certificate | ComposedCertificate | SymbolicCertificate

__all__ = ["main"]

EXIT_NOT_CONVERGENT = EXIT_FAILED
EXIT_INVALID = EXIT_FAILED
EXIT_UNREADABLE = EXIT_NOT_FOUND

T = TypeVar("T")

#: What each kind of input file should be, for the message when it is missing.
MACHINE_FILE = "a machine file (Python, defining a Registry at the top level)"
CERTIFICATE_FILE = "a certificate (written by `govern certify`)"

#: The defaults `--help` shows, written here so that it need not import the certificate modules; they are
#: `govern.certificate._checked.MAX_CLOCK_SKEW` and `govern.certificate._encoding.DEFAULT_MAX_BYTES` (a test
#: checks that they agree).
MAX_CLOCK_SKEW = 300
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: The largest --max-clock-skew, a century: enough to accept any plausible signing date on purpose, and
#: far below the values that overflow date arithmetic.
MAX_CLOCK_SKEW_LIMIT = 100 * 366 * 24 * 3600
#: How much of an input file is read at a time, so that memory follows the file's size, not --max-size.
_READ_PIECE = 1 << 20


def _safe(text: str, *, keep_newlines: bool = False) -> str:
    """Text from a certificate, a machine or an error message, ready for rich: control characters shown as
    visible escapes (the shared sanitizer, `bide._terminal.printable`), then rich markup escaped."""
    from rich.markup import escape

    return escape(printable(text, keep_newlines=keep_newlines))


def _version() -> str:
    from ..certificate._make import tool_version

    return tool_version()


# -- loading machine files -----------------------------------------------------------------------

@dataclass
class Target:
    """One registry found in a machine file."""

    attribute: str
    registry: Registry
    source: Path


def _exists(path: Path) -> bool:
    """Path.exists(), False for a name that cannot be looked up (too long, say): reading it says why."""
    try:
        return path.exists()
    except OSError:
        return False


def _split_spec(spec: str) -> tuple[Path, str | None]:
    path_text, _, name = spec.rpartition(":") if ":" in spec and not _exists(Path(spec)) else (spec, "", "")
    if not path_text:
        path_text, name = spec, ""
    return Path(path_text), (name or None)


def load_targets(spec: str, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Target]:
    """Import the machine file in `spec` (`PATH[:NAME]`) and return its top-level registries.

    NAME selects the registry bound to the top-level variable NAME; when no variable of that name holds a
    registry, the registries whose own name is NAME (so `a = Registry("b")` and `b = Registry("a")` are each
    selected by their variable's name). Raises InputFileUnreadable when the file is missing, cannot be read
    or is larger than `max_bytes` (refused before it is read), and UsageError when it does not import or
    holds no (matching) registry.
    """
    from ..machine._registry import Registry

    path, name = _split_spec(spec)
    size = input_file_size(path, MACHINE_FILE)
    if size > max_bytes:
        raise InputFileUnreadable(
            f"{path} is {size} bytes, over the {max_bytes}-byte limit for a machine file (raise it with "
            "--max-size)"
        )
    if path.suffix == ".json":
        raise UsageError(f"{path} is JSON, not a machine file (Python); to verify a certificate, run "
                         f"`govern check {spec}`")
    # fsencode: a file name need not be UTF-8 (`m\xff.py` is held as a surrogate escape).
    module_name = "_govern_machine_" + hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:16]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    directory = str(path.resolve().parent)
    sys.path.insert(0, directory)
    sys.modules[module_name] = module
    try:
        with _machine_code():
            loader_spec.loader.exec_module(module)
    except _HardExit as exc:
        raise UsageError(f"{path}: the file called os.{exc.what} while being imported") from None
    except SyntaxError as exc:
        line = "" if exc.lineno is None else f":{exc.lineno}"  # None: the file is not text Python reads
        raise UsageError(f"{exc.filename or path}{line}: syntax error: {exc.msg}") from exc
    except GovernError as exc:
        raise UsageError(f"{path}: the machine declaration is invalid: {exc}") from exc
    except SystemExit as exc:
        raise UsageError(f"{path}: the file called sys.exit({exc.code!r}) while being imported") from exc
    except _RaisedInterrupt:
        said = "importing the file raised KeyboardInterrupt (no Ctrl-C was pressed)"
        raise UsageError(f"{path}: {said}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an Exception, or e.g. asyncio.CancelledError: the file does not import
        raise UsageError(f"{path}: importing the file raised {type(exc).__name__}: {shown(exc)}") from exc
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)
    found: list[Target] = []
    seen: set[int] = set()
    for attribute, value in vars(module).items():
        if isinstance(value, Registry) and id(value) not in seen:
            seen.add(id(value))
            found.append(Target(attribute, value, path))
    if not found:
        raise UsageError(f"{path}: no Registry is defined at the top level of the file")
    if name is not None:
        bound = vars(module).get(name)
        if isinstance(bound, Registry):
            # The variable's name wins: it names one registry, while registry names may repeat or cross.
            return [Target(name, bound, path)]
        chosen = [t for t in found if t.registry.name == name]
        if not chosen:
            # Either name selects a registry: a variable's holding it, or the name it was given.
            variables = {k for k, v in vars(module).items() if isinstance(v, Registry)}
            names = ", ".join(sorted(variables | {t.registry.name for t in found}))
            raise UsageError(f"{path}: no registry named {name!r} (these names select one: {names})")
        return chosen
    return found


# -- progress ------------------------------------------------------------------------------------

class Phases:
    """A progress bar over named phases, shown only once a run has lasted more than a second."""

    def __init__(self, console: Console, total: int, enabled: bool) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        )
        self._task = self._progress.add_task("", total=total)
        self._timer: threading.Timer | None = None
        self._started = False
        self._lock = threading.Lock()
        self._enabled = enabled

    def _start(self) -> None:
        with self._lock:
            if not self._started and self._timer is not None:
                self._progress.start()
                self._started = True

    def __enter__(self) -> Phases:
        if self._enabled:
            self._timer = threading.Timer(1.0, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._started:
                self._progress.stop()
                self._started = False

    def phase(self, description: str, run: Callable[[], T]) -> T:
        self._progress.update(self._task, description=description)
        try:
            return run()
        finally:
            self._progress.advance(self._task)


# -- certify -------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What happened to one registry in `govern certify`."""

    name: str
    exit_code: int
    certificate: AnyCertificate | None = None
    path: Path | None = None
    message: str = ""
    counterexample: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        status = {0: "certified", 1: "not-convergent", 2: "input-error", 3: "internal-error"}[self.exit_code]
        out: dict[str, Any] = {"name": self.name, "status": status, "exit_code": self.exit_code,
                               "seconds": {k: round(v, 4) for k, v in self.seconds.items()}}
        if self.certificate is not None:
            out["certificate"] = str(self.path) if self.path else None
            out["digest"] = self.certificate.digest
            out["verdict"] = self.certificate.model.verdict.model_dump(mode="json")
            out["rules_checked"] = self.certificate.has_rules
            signature = self.certificate.signature
            out["signed_by"] = None if signature is None else signature.key_id
            out["rests_on"] = _rests_on(self.certificate)
        if self.message:
            out["message"] = self.message
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample
        return out


@contextlib.contextmanager
def _machine_code() -> Iterator[None]:
    """While code of a machine file runs (its import, and its callable rules while the machine is built):
    what it prints goes to stderr, since stdout carries only govern's own output (one JSON document with
    --json); os._exit and the exec functions raise `_HardExit`; and the working directory is put back. A
    file that changes it (os.chdir(os.path.dirname(__file__)), a common idiom) must not move where -o,
    --sign and the default output are looked for, nor what they are checked against: every path on the
    command line means what it meant when the command started."""
    cwd = os.getcwd()
    limit = sys.getrecursionlimit()  # a file that lowers it must not make govern's own checks fail
    ctrl_c = _CtrlC()
    try:
        with contextlib.redirect_stdout(_Uncloseable(sys.stderr)), _no_hard_exit():
            yield
    except KeyboardInterrupt:
        if not ctrl_c.raised_by_code():
            raise
        # The file's code raised it: an input error like any other, not an interruption (exit 130), which
        # a CI job may retry forever.
        raise _RaisedInterrupt() from None
    finally:
        ctrl_c.restore()
        if os.getcwd() != cwd:
            os.chdir(cwd)
        sys.setrecursionlimit(limit)


class _Uncloseable(WrappedStream):
    """Standard error as a machine file's standard output: what it prints goes there, but its
    `sys.stdout.close()` does not close govern's stderr, which still has to say how the command ended."""

    def close(self) -> None:
        self.flush()


class _CtrlC:
    """Tells a real Ctrl-C from a KeyboardInterrupt that code raises, while a machine file's code runs: a
    SIGINT handler that notes the signal and interrupts as Python's own does. It can tell only in the main
    thread and when SIGINT was Python's default (then its handler must still be the one in place) or
    ignored (no Ctrl-C can come while it still is); otherwise `raised_by_code` says False, as before."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None
        self._expected: Any = None
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.default_int_handler:
            self._expected = self._interrupt
            signal.signal(signal.SIGINT, self._expected)
        elif previous == signal.SIG_IGN:
            self._expected = signal.SIG_IGN
        self._previous = previous

    def _interrupt(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def raised_by_code(self) -> bool:
        """Whether the KeyboardInterrupt being handled came from code, surely, not from a Ctrl-C."""
        if self._expected is None or self.pressed:
            return False
        return bool(signal.getsignal(signal.SIGINT) == self._expected)  # the file did not replace it

    def restore(self) -> None:
        """Put back the handler SIGINT had before, whatever the file's code did with it."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class _RaisedInterrupt(BaseException):
    """A machine file's code raised KeyboardInterrupt itself: no Ctrl-C was pressed."""


def build_machine(target: Target, domain: Any) -> Any:
    """`target.registry.build(domain)`, with the machine file's callable rules run as its import is
    (`_machine_code`). A rule that ends the process (sys.exit, os._exit, an exec) or raises what is not an
    Exception (asyncio.CancelledError) is the file's fault, as at import: `UsageError` (exit 2). A guard
    calling sys.exit(0) made `govern certify` exit 0 with no certificate, and a CI gate passed."""
    where = f"{target.source}: a rule of registry {target.registry.name!r}"
    try:
        with _machine_code():
            return target.registry.build(domain)
    except _HardExit as exc:
        raise UsageError(f"{where} called os.{exc.what} while the machine was built") from None
    except SystemExit as exc:
        raise UsageError(f"{where} called sys.exit({exc.code!r}) while the machine was built") from None
    except _RaisedInterrupt:
        said = "raised KeyboardInterrupt while the machine was built (no Ctrl-C was pressed)"
        raise UsageError(f"{where} {said}") from None
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise UsageError(
            f"{where} raised {type(exc).__name__} while the machine was built: {shown(exc)}"
        ) from exc


class CertifyInterrupted(KeyboardInterrupt):
    """Ctrl-C during `govern certify`, after `outcomes` (the registries certified so far, their files
    written): the report of an interrupted run still says what was written."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__()
        self.outcomes = outcomes


class _HardExit(BaseException):
    """A machine file, while imported, tried to end or replace the process (os._exit, an exec)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


# What ends or replaces the process without unwinding Python (no SystemExit to catch): os's and posix's.
_HARD_EXITS = ("_exit", "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe")


@contextlib.contextmanager
def _no_hard_exit() -> Iterator[None]:
    """Make os._exit and the exec functions raise `_HardExit` meanwhile: a machine file ending the process
    with status 0 while it is imported made `govern certify` exit 0, "certified", with no certificate (a
    CI gate passed). (Code run from the file can still end the process other ways, through ctypes or a
    signal to itself: certify machine files you trust, and have CI check the certificate it wrote.)"""
    import posix

    saved: list[tuple[object, str, object]] = []
    govern_pid = os.getpid()
    for module in (os, posix):
        for name in _HARD_EXITS:
            real = getattr(module, name, None)
            if real is None:
                continue

            def refused(*args: object, _name: str = name, _real: Any = real, **kwargs: object) -> NoReturn:
                if os.getpid() != govern_pid:
                    # A process the file forked (multiprocessing, os.spawnv) ends or execs as it would: raised
                    # there, govern's own error path ran on in the child, printing a second report and
                    # writing certificates again.
                    _real(*args, **kwargs)
                shown = f"{_name}({args[0]!r})" if _name == "_exit" and args else f"{_name}(...)"
                raise _HardExit(shown)

            saved.append((module, name, real))
            setattr(module, name, refused)
    try:
        yield
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def _safe_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "machine"


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: all of it or nothing (a symlink at
    `path` owned by this user is written through: see `bide._files.replaced_file`)."""
    from bide._files import write_whole

    write_whole(path, data, mode=0o644)


def _certify_one(target: Target, args: argparse.Namespace, phases: Phases, signer: Any) -> Outcome:
    from .._errors import DeclarationError, NotConvergent, OracleError, StateSpaceTooLarge
    from ..certificate._make import certificate_for, self_check

    name = target.registry.name
    outcome = Outcome(name, EXIT_OK)

    def timed(label: str, run: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return phases.phase(f"{name}: {label}", run)
        finally:
            outcome.seconds[label] = time.perf_counter() - start

    try:
        machine = timed("build", lambda: build_machine(target, args.domain))
    except NotConvergent as exc:
        outcome.exit_code = EXIT_NOT_CONVERGENT
        outcome.message = str(exc)
        counterexample = getattr(exc, "counterexample", None)
        to_dict = getattr(counterexample, "to_dict", None)
        outcome.counterexample = to_dict() if callable(to_dict) else None
        return outcome
    except (DeclarationError, StateSpaceTooLarge, UsageError) as exc:
        outcome.exit_code = EXIT_USAGE
        outcome.message = str(exc)
        return outcome
    except OracleError as exc:
        outcome.exit_code = EXIT_INTERNAL
        outcome.message = f"{type(exc).__name__}: {exc}"
        return outcome
    try:
        certificate = timed("encode", lambda: certificate_for(machine, version=_version()))
    except CertificateTooLarge as exc:
        outcome.exit_code = EXIT_USAGE
        outcome.message = str(exc)
        return outcome
    try:
        timed("re-check", lambda: self_check(certificate))
    except (CertificateInvalid, CertificateUnreadable) as exc:
        outcome.exit_code = EXIT_INTERNAL
        outcome.message = (f"the engine certified {name!r} but re-checking its certificate failed: {exc}; "
                           "this is a bug in govern, please report it with the machine")
        return outcome
    if signer is not None:
        certificate = certificate.signed(signer)
    outcome.certificate = certificate
    if not args.no_write:
        path = _output_path(target, args)
        try:
            timed("write", lambda: write_atomically(path, certificate.to_bytes()))
        except OSError as exc:
            outcome.exit_code = EXIT_USAGE
            outcome.message = (f"cannot write {path}: {exc.strerror or exc}; nothing was written (a file "
                               "already there is unchanged)")
            return outcome
        outcome.path = path
    if args.graph:
        from ._graph import render_files

        directory = outcome.path.parent if outcome.path else target.source.parent
        try:
            keep = _certify_inputs(target.source, args)
            if outcome.path:
                keep.append(("certificate", outcome.path))
            render_files(certificate, directory, keep=keep)
        except UsageError as exc:
            # The certificate is whole and stays; only the drawings are missing.
            outcome.exit_code = EXIT_USAGE
            written = f" (the certificate was written to {outcome.path})" if outcome.path else ""
            outcome.message = f"{exc}{written}"
    return outcome


def _output_path(target: Target, args: argparse.Namespace) -> Path:
    """Where `certify` writes the certificate of `target`."""
    if args.output:
        return Path(args.output)
    return target.source.parent / f"{_safe_stem(target.registry.name)}.govern-cert.json"


def _refuse_shared_output(targets: list[Target], file_of: Callable[[Target], Path], alone: str) -> None:
    """Raise UsageError, before anything is written, when two of `targets` would write one file (`file_of`
    gives a registry's file, named after the registry): the second would silently replace the first's.
    `alone` is the command that handles one registry alone, with `{spec}` for its PATH:NAME.

    File names that differ only in case count as one: they are one file on macOS and Windows, where a
    certificate made in CI may be checked out."""
    seen: dict[str, Target] = {}
    for target in targets:
        path = file_of(target)
        first = seen.setdefault(str(path).casefold(), target)
        if first is target:
            continue
        where = (str(path) if path == file_of(first)
                 else f"{file_of(first)} and {path} (one file where case is ignored, as on macOS)")
        spec = f"{target.source}:{target.attribute}"
        raise UsageError(
            f"{target.source}: registries {first.attribute!r} (named {first.registry.name!r}) and "
            f"{target.attribute!r} (named {target.registry.name!r}) would both write {where}; give them "
            f"distinct names, or take one at a time: {alone.format(spec=spec)}"
        )


def _events_graph_path(target: Target) -> Path:
    """The first file `render_files` draws for `target` (all of them are named after the registry)."""
    from ._graph import file_stem

    return Path(f"{file_stem(target.registry.name)}.events.dot")


def _refuse_certificate_named_as_drawing(targets: list[Target], args: argparse.Namespace) -> None:
    """Raise UsageError, before anything is written, when `certify --graph` would write a drawing over the
    certificate it has just written (``-o NAME.events.dot``, say)."""
    from ._graph import file_stem, is_drawing_name

    for target in targets:
        path = _output_path(target, args)
        if is_drawing_name(target.registry.name, path.name):
            stem = file_stem(target.registry.name)
            raise UsageError(
                f"-o {path}: --graph writes its drawings beside the certificate, and one of them would be "
                f"that file; name the certificate otherwise (for instance {stem}.govern-cert.json)"
            )


def _certify_inputs(machine: Path, args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The files `certify` reads, and the signing key's public key (FILE.pub, what verifiers pin): nothing
    it writes may replace them."""
    inputs = [("machine file", machine)]
    if args.sign:
        inputs.append(("signing key", Path(args.sign)))
        inputs.append(("signing key's public key", Path(f"{args.sign}.pub")))
    return inputs


def _rests_on(certificate: AnyCertificate) -> str:
    """What a certificate's verdict rests on, in a few words."""
    from ..certificate._symbolic import SymbolicCertificateModel

    if isinstance(certificate.model, SymbolicCertificateModel):
        return f"CP-SAT {certificate.model.solver.version} (ortools), not a proof-derived checker"
    return "the proof-derived checkers"


def _named(names: list[str], index: int) -> str:
    """`names[index]`, or what stands for an index a certificate names with no such entry: `show` renders a
    certificate as it is written, and `check` judges it (such a one is not valid)."""
    return names[index] if 0 <= index < len(names) else f"#{index} (no such entry)"


def _verdict_table(certificate: AnyCertificate) -> Table:
    from rich.table import Table

    from ..certificate._symbolic import SymbolicCertificateModel

    model = certificate.model
    verdict = model.verdict
    events = [e.name for e in model.machine.events]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")

    def pairs(items: list[list[int]]) -> str:
        return _safe(", ".join(f"{_named(events, a)}/{_named(events, b)}" for a, b in items) or "none")

    if isinstance(model, SymbolicCertificateModel):
        table.add_row("states", f"{model.verdict.states:,} (not enumerated: verified symbolically)")
        table.add_row("checked domain", "valid (every valid state)")
    else:
        table.add_row("states", f"{model.verdict.states:,} ({model.verdict.valid_states:,} valid)")
        table.add_row("checked domain", f"{model.verdict.domain} ({model.verdict.domain_states:,} states)")
    depth = verdict.max_repair_depth
    table.add_row("WFC", "yes: every state is valid, no repair needed" if depth == 0
                  else f"yes: every state is repaired in at most {depth} step{'s' if depth > 1 else ''}")
    table.add_row("pairs checked (CC1)",
                  f"{len(verdict.pairs_checked)} ({'all pairs' if verdict.pairs == 'all' else 'declared'})")
    table.add_row("CC2", "holds: compensation may interleave with delivery" if verdict.cc2
                  else "does not hold: apply events to repaired states only (Machine.apply does)")
    if verdict.pairs == "declared":
        table.add_row("causal order needed", pairs(verdict.causal_order_obligations))
    not_idempotent = ", ".join(_named(events, e) for e in verdict.not_idempotent) or "none"
    table.add_row("not idempotent", _safe(not_idempotent))
    if isinstance(model, SymbolicCertificateModel):
        table.add_row("rests on", _safe(_rests_on(certificate)))
    else:
        table.add_row("rules re-checked", "yes (AST)" if certificate.has_rules else "no: Python callables")
    table.add_row("digest", _safe(certificate.digest))
    signature = certificate.signature
    signer = "no" if signature is None else f"{signature.key_id} at {signature.signed_at}"
    table.add_row("signed", _safe(signer))
    return table


def _print_outcome(console: Console, outcome: Outcome) -> None:
    if outcome.exit_code == EXIT_OK and outcome.certificate is not None:
        where = f" -> {outcome.path}" if outcome.path else ""
        total = sum(outcome.seconds.values())
        console.print(
            f"[bold green]certified[/] {_safe(outcome.name)}{_safe(where)} [dim]({total:.2f}s)[/]"
        )
        console.print(_verdict_table(outcome.certificate))
    elif outcome.exit_code == EXIT_NOT_CONVERGENT:
        console.print(f"[bold red]not convergent[/] {_safe(outcome.name)}")
        console.print(_safe(outcome.message, keep_newlines=True), soft_wrap=True)
    else:
        label = "input error" if outcome.exit_code == EXIT_USAGE else "internal error"
        # The message is the user's own machine's (a rule's error and the state it met), over several lines.
        console.print(
            f"[bold red]{label}[/] {_safe(outcome.name)}: {_safe(outcome.message, keep_newlines=True)}",
            soft_wrap=True,
        )


def cmd_certify(args: argparse.Namespace, out: Console, err: Console) -> int:
    inputs = _certify_inputs(_split_spec(args.machine)[0], args)
    names_directory = args.output is not None and (not args.output or args.output.endswith(("/", os.sep)))
    if names_directory and not args.no_write:
        raise UsageError(f"-o {args.output!r} is not a file name: certify writes the certificate to a file, "
                         "never into a directory; give -o DIR/FILE")
    if args.output and not args.no_write:
        # Checked before the machine file is even imported: nothing may be written over an input.
        refuse_overwriting(Path(args.output), inputs)
    targets = load_targets(args.machine, args.max_size)
    if not args.no_write:
        for target in targets:
            refuse_overwriting(_output_path(target, args), inputs)
    if args.output and len(targets) > 1:
        if _split_spec(args.machine)[1] is None:
            raise UsageError(
                f"{args.machine} defines {len(targets)} registries; -o needs one (write PATH:NAME to pick it)"
            )
        variables = ", ".join(repr(t.attribute) for t in targets)
        raise UsageError(
            f"{args.machine} is ambiguous: {len(targets)} registries are named {targets[0].registry.name!r} "
            f"(the variables {variables}); -o needs one: write PATH:VARIABLE to pick it"
        )
    if not args.no_write:
        _refuse_shared_output(
            targets, lambda target: _output_path(target, args), "govern certify {spec} -o FILE"
        )
    if args.graph:
        _refuse_shared_output(targets, _events_graph_path, "govern certify {spec} -o DIR/FILE --graph")
        if not args.no_write:
            _refuse_certificate_named_as_drawing(targets, args)
    if args.output and not is_directory(Path(args.output).parent):
        raise UsageError(f"-o {args.output}: the directory {Path(args.output).parent} does not exist")
    if not args.no_write:
        for target in targets:
            path = _output_path(target, args)
            # The rename that writes a certificate would replace a pipe or a device (-o /dev/null, as root).
            if is_other_than_file(path):
                raise UsageError(f"{path} is not a regular file; give the path of a file to write "
                                 "(or --no-write)")
    from ..certificate._signing import load_private_key

    signer = load_private_key(Path(args.sign)) if args.sign else None
    outcomes: list[Outcome] = []
    try:
        with Phases(err, total=4 * len(targets), enabled=err.is_terminal and not args.json) as phases:
            for target in targets:
                outcomes.append(_certify_one(target, args, phases, signer))
    except KeyboardInterrupt as exc:
        raise CertifyInterrupted(outcomes) from exc
    code = max((o.exit_code for o in outcomes), key=lambda c: (c == EXIT_INTERNAL, c == EXIT_USAGE, c))
    if args.json:
        document = {"exit_code": code, "results": [o.to_json() for o in outcomes]}
        _print(json.dumps(document, indent=2, sort_keys=True))
    else:
        for outcome in outcomes:
            _print_outcome(out, outcome)
    return code


# -- check ---------------------------------------------------------------------------------------

def _read_input(path_text: str, max_bytes: int) -> bytes:
    """The bytes of the certificate file `path_text`: InputFileUnreadable when it is missing or cannot be
    read, CertificateUnreadable when it is over `max_bytes`."""
    path = Path(path_text)
    size = input_file_size(path, CERTIFICATE_FILE)
    if size > max_bytes:
        raise CertificateUnreadable(
            f"{path} is {size} bytes, over the {max_bytes}-byte limit (raise it with --max-size)"
        )
    try:
        with path.open("rb") as handle:
            # In pieces: read(max_bytes + 1) would allocate the whole limit (up to 1 TiB) before reading.
            data = bytearray()
            while len(data) <= max_bytes:
                piece = handle.read(min(_READ_PIECE, max_bytes + 1 - len(data)))
                if not piece:
                    break
                data += piece
            return bytes(data)
    except OSError as exc:
        raise unreadable_input(path, CERTIFICATE_FILE, exc) from None


def _check_rests_on(result: CheckResult | ComposedCheckResult) -> str:
    """What the check just done rests on: the local CP-SAT for a symbolic certificate."""
    from ..certificate._certificate import CheckResult

    if isinstance(result, CheckResult) and result.solver is not None:
        return f"CP-SAT {result.solver.get('version', '?')} (ortools), not a proof-derived checker"
    return "the proof-derived checkers"


def _check_json(result: CheckResult | ComposedCheckResult) -> dict[str, Any]:
    from ..certificate._certificate import CheckResult

    model = result.certificate.model
    return {
        "valid": True,
        "exit_code": EXIT_OK,
        "machine": model.machine.name,
        "digest": model.digest,
        "signature": None if result.signature is None else {
            "key_id": result.signature.key_id, "signed_at": result.signature.signed_at},
        "rules_checked": result.rules_checked,
        "verdict": model.verdict.model_dump(mode="json"),
        "rests_on": _check_rests_on(result),
        "checked_with_solver": result.solver if isinstance(result, CheckResult) else None,
        "checked_with_oracle": result.oracle,
        "certified_with_oracle": dict(model.oracle),
        "steps": result.steps,
        "statement": result.statement(),
    }


def cmd_check(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..certificate._certificate import CheckResult, check_certificate
    from ..certificate._composed import check_composed, is_composed
    from ..certificate._signing import load_public_key

    public_key = load_public_key(Path(args.pubkey)) if args.pubkey else None
    try:
        data = _read_input(args.certificate, args.max_size)
        check = check_composed if is_composed(data) else check_certificate
        result: CheckResult | ComposedCheckResult = check(
            data, public_key=public_key, require_signature=args.require_signature, max_bytes=args.max_size,
            max_clock_skew=args.max_clock_skew)
    except CertificateUnreadable as exc:
        hint = _machine_hint(args.certificate)
        # A machine file given for a certificate: say that first (what the JSON reader makes of Python is
        # no help, and "truncated or edited?" points the wrong way).
        message = f"{hint} ({exc})" if hint else str(exc)
        return _refuse(args, out, err, EXIT_UNREADABLE, "unreadable", message)
    except CertificateInvalid as exc:
        return _refuse(args, out, err, EXIT_INVALID, "not valid", str(exc))
    if args.json:
        _print(json.dumps(_check_json(result), indent=2, sort_keys=True))
        return EXIT_OK
    if isinstance(result, CheckResult) and result.solver is not None:
        # The weaker claim, first: no proof-derived checker ran on a symbolic certificate.
        out.print(f"[bold yellow]valid, resting on {_safe(_check_rests_on(result))}[/] "
                  f"{_safe(args.certificate)}")
    else:
        out.print(f"[bold green]valid[/] {_safe(args.certificate)}")
    for step in result.steps:
        out.print(f"  [green]✓[/] {_safe(step)}", soft_wrap=True)
    if result.oracle != dict(result.certificate.model.oracle):
        out.print("  [yellow]note[/]: the certificate was made with a different oracle build than the one "
                  "that checked it here (both identities are in --json)", soft_wrap=True)
    out.print()
    out.print(_safe(_wrap(result.statement()), keep_newlines=True), soft_wrap=True)
    return EXIT_OK


def _state_limit(text: str) -> int:
    """A --state-limit value: a whole number of states, 0 or more (0 draws no state graph)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (0 draws no state graph), got {value}")
    return value


def _machine_hint(path_text: str) -> str:
    """A hint for the common mistake of checking a machine file instead of certifying it."""
    path = Path(path_text)
    if path.suffix == ".py" or _looks_like_python(path):
        return (f"this looks like a machine file (Python), not a certificate; did you mean "
                f"`govern certify {path_text}`? It writes the certificate that `govern check` verifies")
    return ""


def _looks_like_python(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).lstrip()
    except OSError:
        return False
    return head.startswith((b"import ", b"from ", b"#", b'"""', b"def ", b"class "))


def _refuse(args: argparse.Namespace, out: Console, err: Console, code: int, label: str, message: str) -> int:
    if getattr(args, "json", False):
        _print(json.dumps({"valid": False, "exit_code": code, "reason": label, "message": message}, indent=2,
                          sort_keys=True))
    else:
        err.print(f"[bold red]{label}[/]: {_safe(args.certificate)}: {_safe(message)}")
    return code


# -- show ----------------------------------------------------------------------------------------

def cmd_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    from rich.table import Table

    from ..certificate._composed import ComposedCertificate
    from ..certificate._render import render_assignment, render_expression, render_value
    from ..certificate._symbolic import SymbolicCertificateModel

    try:
        certificate = _read_any(_read_input(args.certificate, args.max_size), args.max_size)
    except CertificateUnreadable as exc:
        hint = _machine_hint(args.certificate)  # as `govern check` gives it
        return _refuse(args, out, err, EXIT_UNREADABLE, "unreadable", f"{hint} ({exc})" if hint else str(exc))
    if isinstance(certificate, ComposedCertificate):
        return _show_composed(certificate, out)
    model = certificate.model
    machine = model.machine
    out.print(f"[bold]machine {_safe(machine.name)}[/]  [dim]{_safe(model.format)}, "
              f"made by govern {_safe(model.tool.version)}[/]")
    out.print("[dim]shown as written; `govern check` verifies it[/]")
    variables = Table(title="variables", title_justify="left")
    for column in ("name", "kind", "values", "initial"):
        variables.add_column(column)
    for index, variable in enumerate(machine.variables):
        if variable.kind == "bool":
            values = "False, True"
        elif variable.kind == "enum":
            values = ", ".join(variable.labels)
        else:
            values = f"{variable.min} .. {variable.max}"
        initial = render_value(machine, index, machine.initial[index])
        variables.add_row(_safe(variable.name), variable.kind, _safe(values), _safe(initial))
    out.print(variables)
    invariants = Table(title="invariants (repair order)", title_justify="left")
    for column in ("#", "name", "must hold", "repair"):
        invariants.add_column(column)
    for index, invariant in enumerate(machine.invariants):
        invariants.add_row(str(index + 1), _safe(invariant.name),
                           _safe(render_expression(machine, invariant.holds)),
                           _safe(render_assignment(machine, invariant.repair)))
    out.print(invariants if machine.invariants else "[dim]no invariants[/]")
    events = Table(title="events", title_justify="left")
    for column in ("name", "when", "effect", "idempotent"):
        events.add_column(column)
    for index, event in enumerate(machine.events):
        events.add_row(_safe(event.name), _safe(render_expression(machine, event.guard)),
                       _safe(render_assignment(machine, event.effect)),
                       "no" if index in model.verdict.not_idempotent else "yes")
    out.print(events)
    if machine.independent is None:
        out.print("[bold]independence[/]: none declared, so every pair of events was checked")
    else:
        names = [e.name for e in machine.events]
        pairs = ", ".join(f"{_named(names, a)}/{_named(names, b)}" for a, b in machine.independent) or "none"
        out.print(f"[bold]declared independent[/]: {_safe(pairs)}")
    out.print(_verdict_table(certificate))
    if isinstance(model, SymbolicCertificateModel):
        return EXIT_OK  # no oracle gated it: the table above says what it rests on
    out.print("[bold]oracle that gated the build[/]:")
    for key, value in sorted(model.oracle.items()):
        out.print(f"  {_safe(key)}: {_safe(value)}", soft_wrap=True)
    return EXIT_OK


def _show_composed(certificate: ComposedCertificate, out: Console) -> int:
    from rich.table import Table

    model = certificate.model
    names = [v.name for v in model.machine.variables]
    events = [e.name for e in model.machine.events]
    out.print(f"[bold]machine {_safe(model.machine.name)}[/]  [dim]{_safe(model.format)}, "
              f"made by govern {_safe(model.tool.version)}[/]")
    out.print("[dim]shown as written; `govern check` verifies it (each component with `govern show` "
              "on its own certificate shows its rules)[/]")
    table = Table(title=f"{len(model.components)} components", title_justify="left")
    for column in ("#", "variables", "events", "states"):
        table.add_column(column)
    for c, entry in enumerate(model.components):
        table.add_row(str(c), _safe(", ".join(_named(names, v) for v in entry.variables)),
                      _safe(", ".join(_named(events, e) for e in entry.events)),
                      f"{entry.certificate['verdict']['states']:,}")
    out.print(table)
    out.print(_verdict_table(certificate))
    return EXIT_OK


# -- keygen --------------------------------------------------------------------------------------

def cmd_keygen(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.path and args.output and args.path != args.output:
        raise UsageError(f"two key paths given ({args.path} and -o {args.output}); "
                         "give one: govern keygen FILE")
    from ..certificate._signing import generate_key_pair

    given = args.path if args.path is not None else args.output
    if given is not None and (not given or given.endswith(("/", os.sep))):
        raise UsageError(f"{given!r} is not a key file name; give FILE (the public key goes to FILE.pub)")
    private = Path(given or "govern-signing-key")
    public, identifier = generate_key_pair(private, overwrite=args.force)
    out.print(f"private key: {_safe(str(private))} (mode 0600; keep it secret, never commit it)")
    out.print(f"public key:  {_safe(str(public))} (give this to whoever runs `govern check --pubkey`)")
    out.print(f"key id:      {_safe(identifier)}")
    return EXIT_OK


# -- graph ---------------------------------------------------------------------------------------

def _read_any(data: bytes, max_bytes: int) -> AnyCertificate:
    """A certificate of any format, read strictly (`CertificateUnreadable`), not checked."""
    from ..certificate._read import read_certificate

    return read_certificate(data, max_bytes=max_bytes)


def cmd_graph(args: argparse.Namespace, out: Console, err: Console) -> int:
    import shutil

    from ._graph import render_files

    if args.png and shutil.which("dot") is None:
        # Asked for a picture that cannot be drawn: say so before anything is written, not exit 0 without it.
        raise UsageError(
            "--png needs Graphviz's `dot`, which is not installed (apt-get install graphviz, brew install "
            "graphviz); nothing was written. Without --png, govern graph writes DOT and Mermaid text"
        )
    source = args.source
    certificates: list[AnyCertificate] = []
    if source.endswith(".json"):
        try:
            certificates.append(_read_any(_read_input(source, args.max_size), args.max_size))
        except CertificateUnreadable as exc:
            err.print(f"[bold red]unreadable[/]: {_safe(source)}: {_safe(str(exc))}")
            return EXIT_UNREADABLE
    else:
        from .._errors import DeclarationError, NotConvergent, StateSpaceTooLarge
        from ..certificate._make import certificate_for

        targets = load_targets(source, args.max_size)
        _refuse_shared_output(targets, _events_graph_path, "govern graph {spec} -o DIR")
        for target in targets:
            try:
                certificates.append(certificate_for(build_machine(target, args.domain), version=_version()))
            except NotConvergent as exc:
                err.print(f"[bold red]not convergent[/] {_safe(target.registry.name)}: nothing to draw\n"
                          f"{_safe(str(exc), keep_newlines=True)}")
                return EXIT_NOT_CONVERGENT
            except (DeclarationError, StateSpaceTooLarge, CertificateTooLarge) as exc:
                # The machine's own fault, as in `certify`: an input error, not a bug in govern.
                raise UsageError(f"{target.registry.name}: {exc}") from exc
    source_file = Path(source) if source.endswith(".json") else _split_spec(source)[0]
    # Next to the file itself: a certificate never takes `:NAME`, and a path may hold a colon of its own.
    directory = Path(args.output) if args.output else source_file.parent
    if not is_directory(directory):
        if directory.exists() or directory.is_symlink():
            raise UsageError(f"{directory} is not a directory: -o names the directory the drawings go to")
        raise UsageError(f"{directory}: no such directory")
    keep = [("certificate" if source.endswith(".json") else "machine file", source_file)]
    for certificate in certificates:
        files = render_files(certificate, directory, state_limit=args.state_limit, png=args.png, keep=keep)
        for path in files.written:
            out.print(f"wrote {_safe(str(path))}")
        for reason in files.skipped:
            out.print(f"[dim]{_safe(reason)}[/]")
        if not files.graphviz:
            out.print("[dim]Graphviz `dot` is not installed: wrote Mermaid text instead of SVG[/]")
    return EXIT_OK


# -- entry point ---------------------------------------------------------------------------------

def _seconds(text: str) -> int:
    value = skew_seconds(text)
    if value > MAX_CLOCK_SKEW_LIMIT:
        raise argparse.ArgumentTypeError(
            f"{value} s is more than a century; at most {MAX_CLOCK_SKEW_LIMIT}"
        )
    return value


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=88)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `govern` command."""
    parser = Parser(
        prog="govern",
        description="Certify governed state machines, and check their certificates offline.",
    )
    add_standard_options(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    certify = commands.add_parser(
        "certify", help="build, verify and certify every Registry in a machine file",
        description=_wrap("Import PATH, build every Registry defined at its top level (or the one named by "
                          ":NAME), verify convergence with the engine and the proof-derived oracle, and "
                          "write a certificate for each."))
    certify.add_argument("machine", metavar="PATH[:NAME]", help="a Python file defining Registry objects")
    certify.add_argument("-o", "--output", metavar="FILE",
                         help="where to write the certificate (default: NAME.govern-cert.json next to PATH)")
    certify.add_argument("--sign", metavar="KEYFILE",
                         help="sign with this Ed25519 private key (govern keygen)")
    certify.add_argument("--json", action="store_true", help="print a JSON report instead of tables")
    certify.add_argument("--graph", action="store_true", help="also draw the machine (see `govern graph`)")
    certify.add_argument("--domain", choices=("valid", "reachable"), default="valid",
                         help="checked domain: every valid state (default) or those reachable from the "
                              "initial state")
    certify.add_argument("--no-write", action="store_true", help="verify and report, but write no file")
    certify.add_argument("--max-size", type=byte_limit, default=DEFAULT_MAX_BYTES, metavar="BYTES",
                         help=f"refuse a larger machine file before reading it (default {DEFAULT_MAX_BYTES})")
    certify.set_defaults(run=cmd_certify)

    check = commands.add_parser(
        "check", help="verify a certificate offline (runs no code from the certificate)",
        description=_wrap("Verify a certificate: strict parsing, digest, signature, the proof-derived table "
                          "checker over its tables, and the rules checker over its rules. Imports and runs "
                          "nothing but this package."))
    check.add_argument("certificate", metavar="CERT")
    check.add_argument("--pubkey", metavar="KEY",
                       help="require a valid signature by this public key (.pub file)")
    check.add_argument("--require-signature", action="store_true",
                       help="require a valid signature by the key the certificate names")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.add_argument("--max-clock-skew", type=_seconds, default=MAX_CLOCK_SKEW, metavar="SECONDS",
                       help=f"refuse a signature dated more than this beyond this clock "
                            f"(default {MAX_CLOCK_SKEW})")
    check.add_argument("--max-size", type=byte_limit, default=DEFAULT_MAX_BYTES, metavar="BYTES",
                       help=f"refuse larger files (default {DEFAULT_MAX_BYTES})")
    check.set_defaults(run=cmd_check)

    show = commands.add_parser("show", help="render a certificate for people (does not verify it)")
    show.add_argument("certificate", metavar="CERT")
    show.add_argument("--max-size", type=byte_limit, default=DEFAULT_MAX_BYTES, metavar="BYTES")
    show.set_defaults(run=cmd_show)

    keygen = commands.add_parser("keygen", help="create an Ed25519 signing key pair")
    keygen.add_argument("path", metavar="FILE", nargs="?",
                        help="private key path (default govern-signing-key); the public key is FILE.pub")
    keygen.add_argument("-o", "--output", metavar="FILE", help="the same as FILE (kept for old scripts)")
    keygen.add_argument("--force", action="store_true", help="replace existing key files")
    keygen.set_defaults(run=cmd_keygen)

    graph = commands.add_parser(
        "graph", help="draw the event/independence graph and the state graph",
        description=_wrap("Write DOT files (and SVG with Graphviz installed, Mermaid text otherwise) for a "
                          "machine file or a certificate."))
    graph.add_argument("source", metavar="PATH[:NAME]|CERT")
    graph.add_argument("-o", "--output", metavar="DIR",
                       help="directory for the files (default: next to PATH)")
    graph.add_argument("--state-limit", type=_state_limit, default=64, metavar="N",
                       help="draw the state graph only for domains of at most N states (default 64)")
    graph.add_argument("--png", action="store_true", help="also write PNG (needs Graphviz)")
    graph.add_argument("--domain", choices=("valid", "reachable"), default="valid")
    graph.add_argument("--max-size", type=byte_limit, default=DEFAULT_MAX_BYTES, metavar="BYTES",
                       help=f"refuse a larger machine file or certificate (default {DEFAULT_MAX_BYTES})")
    graph.set_defaults(run=cmd_graph)
    return parser


def _json_failure(
    args: argparse.Namespace, code: int, reason: str, message: str, results: list[Outcome] | None = None
) -> None:
    """With --json, the one JSON document on stdout for a command that failed before printing its own
    (`certify`: with the `results` of the registries it had finished)."""
    if not getattr(args, "json", False):
        return
    document: dict[str, Any] = {"exit_code": code, "reason": reason, "message": message}
    if args.command == "check":
        document["valid"] = False
    else:
        document["results"] = [outcome.to_json() for outcome in results or []]
    _print(json.dumps(document, indent=2, sort_keys=True))


def _print(text: str) -> None:
    """Print a JSON document; one that cannot be written is said as the command ends (see bide._stdout)."""
    print(text, file=GuardedStdout(sys.stdout), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the `govern` command; returns (and, as a console script, exits with) the exit code."""
    closed_stdout_fails()
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # `check --json` and `certify --json` print one JSON document on every exit, a usage error too.
        command = next((word for word in given if word in ("check", "certify")), None)
        if exc.code == EXIT_USAGE and command is not None and "--json" in given:
            refused = argparse.Namespace(json=True, command=command)
            why = f": {exc.message}" if isinstance(exc, UsageRefused) else ""
            said = f"the arguments were refused{why}"
            emitted(lambda: _json_failure(refused, EXIT_USAGE, "usage error", said), EXIT_USAGE)
            raise
        raise informational_exit(exc) from None
    from rich.console import Console

    class Output(Console):
        def on_broken_pipe(self) -> None:
            # rich exits with 1 here, which `govern check` uses for "not valid": keep the real verdict.
            self.quiet = True
            silence_stdout()

    out = Output(file=cast("IO[str]", GuardedStdout(sys.stdout)), highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        code: int = args.run(args, out, err)
    except UsageError as exc:
        if args.debug:
            traceback.print_exc()
        err.print(f"[bold red]error[/]: {_safe(str(exc))}")
        code = EXIT_USAGE
        _json_failure(args, code, "usage error", str(exc))
    except (InputFileUnreadable, KeyFileUnreadable) as exc:
        if args.debug:
            traceback.print_exc()
        err.print(f"[bold red]error[/]: {_safe(str(exc))}")
        code = EXIT_NOT_FOUND
        _json_failure(args, code, "not found", str(exc))
    except SigningKeyError as exc:
        if args.debug:
            traceback.print_exc()
        err.print(f"[bold red]key error[/]: {_safe(str(exc))}")
        code = EXIT_USAGE
        _json_failure(args, code, "key error", str(exc))
    except KeyboardInterrupt as exc:
        finished = exc.outcomes if isinstance(exc, CertifyInterrupted) else []
        written = [f"{outcome.path} ({outcome.name})" for outcome in finished if outcome.path is not None]
        said = "interrupted (Ctrl-C): each file is written whole or not at all"
        if written:
            said += f"; written before the interruption: {', '.join(written)}"
        err.print(_safe(said))
        code = 130
        _json_failure(args, code, "interrupted", said, finished)
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        err.print(f"[bold red]internal error[/]: {type(exc).__name__}: {_safe(str(exc))} "
                  "(this is a bug in govern; rerun with --debug and report the traceback)")
        code = EXIT_INTERNAL
        _json_failure(args, code, "internal error", f"{type(exc).__name__}: {exc}")
    return ended(code)
