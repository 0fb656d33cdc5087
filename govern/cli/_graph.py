"""Pictures of a certified machine: the event/independence graph and the valid-state transition graph.

Both are computed from a certificate (its machine JSON and tables), so they show exactly what was
certified. A composed certificate's event graph boxes each component's events (events of different
components always commute), and each component with a small enough domain gets a state graph of its
own; a symbolic certificate has no tables, so it gets the event graph only. Output is Graphviz DOT
text; `render_files` adds SVG (and PNG) when Graphviz's `dot` is installed, and Mermaid text otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..certificate._analysis import analyse_tables
from ..certificate._certificate import Certificate
from ..certificate._composed import ComposedCertificate
from ..certificate._model import initial_state
from ..certificate._render import render_state, state_values
from ..certificate._symbolic import SymbolicCertificate
from ._paths import UsageError, is_other_than_file, refuse_overwriting

__all__ = [
    "GraphFiles",
    "StateGraph",
    "event_graph_dot",
    "event_graph_mermaid",
    "file_stem",
    "render_files",
    "state_graph",
    "state_graph_dot",
    "state_graph_mermaid",
]

#: The state graph is drawn only for domains up to this many states (a person cannot read more).
DEFAULT_STATE_LIMIT = 64
#: Any certificate `govern` writes.
AnyCertificate = Certificate | ComposedCertificate | SymbolicCertificate


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _mermaid_text(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("\n", "<br/>") + '"'


def _pair_sets(certificate: AnyCertificate) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    verdict = certificate.model.verdict
    checked = {(a, b) for a, b in verdict.pairs_checked}
    ordered = {(a, b) for a, b in verdict.causal_order_obligations}
    return checked, ordered


def _named(names: Sequence[str], index: int) -> str:
    """`names[index]`, or what stands for a position the certificate gives with no such entry: the drawing
    shows a certificate as it is written, as `govern show` does (`govern check` finds it not valid)."""
    return names[index] if 0 <= index < len(names) else f"#{index} (no such entry)"


def _event_name(certificate: AnyCertificate, index: int) -> str:
    return _named([e.name for e in certificate.model.machine.events], index)


def _event_groups(certificate: AnyCertificate) -> list[tuple[str | None, list[int]]]:
    """The events to draw, grouped: one unnamed group, or one group per component of a composed
    certificate (named by its variables)."""
    machine = certificate.model.machine
    if not isinstance(certificate, ComposedCertificate):
        return [(None, list(range(len(machine.events))))]
    names = [v.name for v in machine.variables]
    return [
        (f"component {c}: " + ", ".join(_named(names, v) for v in entry.variables), list(entry.events))
        for c, entry in enumerate(certificate.model.components)
    ]


def event_graph_dot(certificate: AnyCertificate) -> str:
    """DOT for the event graph: an edge joins two events that commute (checked independent); a red
    dashed edge joins an undeclared pair that does not commute (deliver those in causal order);
    events that are not idempotent have a double border. A composed certificate's components are
    boxes: events in different boxes commute at every state, and no edge is drawn between them."""
    model = certificate.model
    checked, ordered = _pair_sets(certificate)
    legend = "events: solid = checked independent, red dashed = must be delivered in order"
    if isinstance(certificate, ComposedCertificate):
        legend += "; events in different boxes (components) always commute"
    lines = [
        f"graph {_quote(model.machine.name + ' events')} {{",
        f'  graph [label={_quote(legend)}, labelloc=t, fontname="Helvetica"];',
        '  node [shape=box, style=rounded, fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for c, (label, members) in enumerate(_event_groups(certificate)):
        indent = "  "
        if label is not None:
            lines.append(f"  subgraph cluster_{c} {{")
            lines.append(f'    label={_quote(label)}; style=dashed; fontname="Helvetica";')
            indent = "    "
        for index in members:
            name = _event_name(certificate, index)
            once = index in model.verdict.not_idempotent
            extra = ', peripheries=2, xlabel="not idempotent"' if once else ""
            lines.append(f"{indent}e{index} [label={_quote(name)}{extra}];")
        if label is not None:
            lines.append("  }")
    for a, b in sorted(checked):
        lines.append(f"  e{a} -- e{b};")
    for a, b in sorted(ordered):
        lines.append(f'  e{a} -- e{b} [style=dashed, color=red, label="order"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def event_graph_mermaid(certificate: AnyCertificate) -> str:
    """The event graph as Mermaid flowchart text (for places that render Mermaid, such as GitHub);
    a composed certificate's components are subgraphs."""
    model = certificate.model
    checked, ordered = _pair_sets(certificate)
    lines = ["flowchart LR"]
    for c, (label, members) in enumerate(_event_groups(certificate)):
        if label is not None:
            lines.append(f"  subgraph c{c}[{_mermaid_text(label)}]")
        for index in members:
            name = _event_name(certificate, index)
            text = name + (" (not idempotent)" if index in model.verdict.not_idempotent else "")
            lines.append(f"  e{index}({_mermaid_text(text)})")
        if label is not None:
            lines.append("  end")
    for a, b in sorted(checked):
        lines.append(f"  e{a} --- e{b}")
    for a, b in sorted(ordered):
        lines.append(f"  e{a} -. order .- e{b}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class StateGraph:
    """The transitions between domain states: `edges[(s, t)]` lists the events that step s to t."""

    nodes: list[int]
    initial: int
    edges: dict[tuple[int, int], list[str]]


def state_graph(certificate: Certificate, *, limit: int = DEFAULT_STATE_LIMIT) -> StateGraph | None:
    """The valid-state transition graph over the checked domain, or None when it has over `limit`
    states. Self-loops (an event that changes nothing) are left out."""
    model = certificate.model
    machine = model.machine
    if model.verdict.domain_states > limit:
        return None
    initial = initial_state(machine)
    analysis = analyse_tables(
        certificate.valid, certificate.repair, certificate.apply, events=len(machine.events),
        initial=initial, independent=machine.independent, domain=machine.domain,
    )
    if analysis.step is None:
        return None
    step = analysis.step
    if machine.domain == "valid":
        nodes = [int(s) for s in np.flatnonzero(certificate.valid)]
    else:
        seen = {initial}
        frontier = [initial]
        while frontier:
            nxt = []
            for s in frontier:
                for e in range(len(machine.events)):
                    t = int(step[e][s])
                    if t not in seen:
                        seen.add(t)
                        nxt.append(t)
            frontier = nxt
        nodes = sorted(seen)
    edges: dict[tuple[int, int], list[str]] = {}
    for s in nodes:
        for e, event in enumerate(machine.events):
            t = int(step[e][s])
            if t != s:
                edges.setdefault((s, t), []).append(event.name)
    return StateGraph(nodes, initial, edges)


def state_graph_dot(certificate: Certificate, graph: StateGraph) -> str:
    """DOT for the state graph; the initial state is drawn bold."""
    machine = certificate.model.machine
    lines = [
        f"digraph {_quote(machine.name + ' states')} {{",
        f'  graph [label={_quote(machine.name + ": " + machine.domain + " states, normalized steps")}, '
        'labelloc=t, fontname="Helvetica", rankdir=LR];',
        '  node [shape=box, style=rounded, fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for s in graph.nodes:
        label = render_state(machine, state_values(machine, s), separator="\n")
        extra = ", penwidth=2.5" if s == graph.initial else ""
        lines.append(f"  s{s} [label={_quote(label)}{extra}];")
    for (s, t), names in sorted(graph.edges.items()):
        lines.append(f"  s{s} -> s{t} [label={_quote(', '.join(names))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def state_graph_mermaid(certificate: Certificate, graph: StateGraph) -> str:
    """The state graph as Mermaid flowchart text."""
    machine = certificate.model.machine
    lines = ["flowchart LR"]
    for s in graph.nodes:
        label = render_state(machine, state_values(machine, s), separator="\n")
        shape = ("[[", "]]") if s == graph.initial else ("(", ")")
        lines.append(f"  s{s}{shape[0]}{_mermaid_text(label)}{shape[1]}")
    for (s, t), names in sorted(graph.edges.items()):
        lines.append(f"  s{s} -->|{_mermaid_text(', '.join(names))}| s{t}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GraphFiles:
    """The files `render_files` wrote, and the state graphs it left out (each with the reason)."""

    written: list[Path]
    skipped: list[str]
    graphviz: bool


def file_stem(name: str) -> str:
    """The start of the name of every file drawn for the machine `name` (`NAME.events.dot`, ...)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# What follows the stem in a drawing's file name (see `render_files`).
_DRAWING_SUFFIX = re.compile(r"\.(?:events|(?:component\d+\.)?states)\.(?:dot|svg|png|mmd)")


def is_drawing_name(name: str, file_name: str) -> bool:
    """True when `render_files` may write a file called `file_name` for the machine `name` (case ignored,
    as on macOS)."""
    stem, file_name = file_stem(name).casefold(), file_name.casefold()
    return file_name.startswith(stem) and _DRAWING_SUFFIX.fullmatch(file_name[len(stem):]) is not None


def _staged(path: Path, staged: list[tuple[Path, Path]]) -> Path:
    """A new empty temporary file beside `path` (mode 0644), to be renamed over it once written; recorded
    in `staged` with `path` at once, so that it is removed whatever fails next."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    staged.append((Path(temp), path))
    try:
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    return Path(temp)


def _stage_text(path: Path, text: str, staged: list[tuple[Path, Path]]) -> Path:
    """Write `text` to a temporary file beside `path`, recorded in `staged` with `path`; returns it."""
    temp = _staged(path, staged)
    with temp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return temp


def _stage_drawing(dot: str, source: Path, target: Path, staged: list[tuple[Path, Path]]) -> None:
    """Have Graphviz draw the DOT file `source` in `target`'s format (its suffix) into a temporary file
    beside `target`, recorded in `staged` with `target`."""
    temp = _staged(target, staged)
    fmt = target.suffix.lstrip(".")
    subprocess.run([dot, f"-T{fmt}", "-o", str(temp), str(source)], check=True, capture_output=True,
                   timeout=120)


def _table_parts(certificate: AnyCertificate) -> list[tuple[str, Certificate]]:
    """The table certificates whose state graphs can be drawn, each with its file-name suffix."""
    if isinstance(certificate, ComposedCertificate):
        return [(f".component{c}", part) for c, part in enumerate(certificate.components)]
    if isinstance(certificate, Certificate):
        return [("", certificate)]
    return []


def render_files(
    certificate: AnyCertificate,
    directory: Path,
    *,
    state_limit: int = DEFAULT_STATE_LIMIT,
    png: bool = False,
    keep: Sequence[tuple[str, Path]] = (),
) -> GraphFiles:
    """Write `NAME.events.dot` and (for small domains) `NAME.states.dot` into `directory` (for a composed
    certificate `NAME.componentC.states.dot` per component); with Graphviz installed also `.svg` (and
    `.png` if asked), otherwise `.mmd` Mermaid files. Writes nothing, raising `UsageError`, when one of
    those files would be one of `keep` (what the command read, each with what it is), or when one cannot
    be written (a full disk, a failing Graphviz): then every file there keeps what it held."""
    stem = file_stem(certificate.name)
    dot = shutil.which("dot")
    written: list[Path] = []
    skipped: list[str] = []
    graphs: list[tuple[str, str, str]] = [
        (f"{stem}.events", event_graph_dot(certificate), event_graph_mermaid(certificate))
    ]
    if isinstance(certificate, SymbolicCertificate):
        skipped.append(f"{certificate.name}: verified symbolically, no tables: state graph left out")
    for suffix, part in _table_parts(certificate):
        states = state_graph(part, limit=state_limit)
        if states is None:
            size = part.model.verdict.domain_states
            skipped.append(f"{part.name}: {size:,} states in the domain, over --state-limit "
                           f"{state_limit}: state graph left out")
            continue
        dot_text, mermaid_text = state_graph_dot(part, states), state_graph_mermaid(part, states)
        graphs.append((f"{stem}{suffix}.states", dot_text, mermaid_text))
    formats = (["svg", "png"] if png else ["svg"]) if dot is not None else ["mmd"]
    for base, _, _ in graphs:
        for suffix in ("dot", *formats):
            target = directory / f"{base}.{suffix}"
            refuse_overwriting(target, list(keep))
            # Checked before any file is renamed into place: a rename that fails half-way through the set
            # (onto a directory, say) would leave the drawings half replaced.
            if is_other_than_file(target):
                raise UsageError(
                    f"{target} is not a regular file (a directory, a pipe or a device): the drawings of "
                    f"{certificate.name!r} would replace it; no drawing was written"
                )
    # Every file is written in full beside its place first, then all are renamed into place: a full disk or
    # a failing Graphviz leaves no file half-written, no set half-drawn, and what was there unchanged.
    staged: list[tuple[Path, Path]] = []
    try:
        for base, dot_text, mermaid_text in graphs:
            source = directory / f"{base}.dot"
            dot_file = _stage_text(source, dot_text, staged)
            if dot is not None:
                for fmt in formats:
                    _stage_drawing(dot, dot_file, source.with_suffix("." + fmt), staged)
            else:
                _stage_text(directory / f"{base}.mmd", mermaid_text, staged)
        for temp, path in staged:
            os.replace(temp, path)
            written.append(path)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(_unwritten(certificate.name, directory, exc, written)) from exc
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
    return GraphFiles(written, skipped, dot is not None)


def _unwritten(name: str, directory: Path, error: Exception, written: list[Path]) -> str:
    """Why the drawings of machine `name` could not be written into `directory`, and what was."""
    if isinstance(error, subprocess.CalledProcessError):
        output = error.stderr.decode("utf-8", "replace").strip() if isinstance(error.stderr, bytes) else ""
        why = f"Graphviz `dot` failed: {output or f'exit {error.returncode}'}"
    else:
        why = (error.strerror if isinstance(error, OSError) else None) or str(error)
    done = "no drawing was written" if not written else f"only {', '.join(p.name for p in written)} replaced"
    return f"cannot write the drawings of {name!r} into {directory}: {why}; {done}"
