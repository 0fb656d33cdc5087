"""Pictures of a certified machine: the event/independence graph and the valid-state transition graph.

Both are computed from a certificate (its machine JSON and tables), so they show exactly what was
certified. Output is Graphviz DOT text; `render_files` adds SVG (and PNG) when Graphviz's `dot` is
installed, and Mermaid text otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..certificate._analysis import analyse_tables
from ..certificate._certificate import Certificate
from ..certificate._model import initial_state
from ..certificate._render import render_state, state_values

__all__ = [
    "GraphFiles",
    "StateGraph",
    "event_graph_dot",
    "event_graph_mermaid",
    "render_files",
    "state_graph",
    "state_graph_dot",
    "state_graph_mermaid",
]

#: The state graph is drawn only for domains up to this many states (a person cannot read more).
DEFAULT_STATE_LIMIT = 64


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _mermaid_text(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("\n", "<br/>") + '"'


def _pair_sets(certificate: Certificate) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    verdict = certificate.model.verdict
    checked = {(a, b) for a, b in verdict.pairs_checked}
    ordered = {(a, b) for a, b in verdict.causal_order_obligations}
    return checked, ordered


def event_graph_dot(certificate: Certificate) -> str:
    """DOT for the event graph: an edge joins two events that commute (checked independent); a red
    dashed edge joins an undeclared pair that does not commute (deliver those in causal order);
    events that are not idempotent have a double border."""
    model = certificate.model
    checked, ordered = _pair_sets(certificate)
    lines = [
        f"graph {_quote(model.machine.name + ' events')} {{",
        '  graph [label="events: solid = checked independent, red dashed = must be delivered in order", '
        'labelloc=t, fontname="Helvetica"];',
        '  node [shape=box, style=rounded, fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for index, event in enumerate(model.machine.events):
        extra = ", peripheries=2, xlabel=\"not idempotent\"" if index in model.verdict.not_idempotent else ""
        lines.append(f"  e{index} [label={_quote(event.name)}{extra}];")
    for a, b in sorted(checked):
        lines.append(f"  e{a} -- e{b};")
    for a, b in sorted(ordered):
        lines.append(f'  e{a} -- e{b} [style=dashed, color=red, label="order"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def event_graph_mermaid(certificate: Certificate) -> str:
    """The event graph as Mermaid flowchart text (for places that render Mermaid, such as GitHub)."""
    model = certificate.model
    checked, ordered = _pair_sets(certificate)
    lines = ["flowchart LR"]
    for index, event in enumerate(model.machine.events):
        label = event.name + (" (not idempotent)" if index in model.verdict.not_idempotent else "")
        lines.append(f"  e{index}({_mermaid_text(label)})")
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
    """The files `render_files` wrote, and whether the state graph was left out for size."""

    written: list[Path]
    state_graph_skipped: bool
    graphviz: bool


def _write(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _dot_render(dot: str, source: Path, formats: list[str]) -> list[Path]:
    outputs = []
    for fmt in formats:
        target = source.with_suffix("." + fmt)
        subprocess.run([dot, f"-T{fmt}", "-o", str(target), str(source)], check=True,
                       capture_output=True, timeout=120)
        outputs.append(target)
    return outputs


def render_files(
    certificate: Certificate, directory: Path, *, state_limit: int = DEFAULT_STATE_LIMIT, png: bool = False
) -> GraphFiles:
    """Write `NAME.events.dot` and (for small domains) `NAME.states.dot` into `directory`; with
    Graphviz installed also `.svg` (and `.png` if asked), otherwise `.mmd` Mermaid files."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in certificate.name)
    dot = shutil.which("dot")
    written: list[Path] = []
    graphs: list[tuple[str, str, str]] = [
        ("events", event_graph_dot(certificate), event_graph_mermaid(certificate))
    ]
    states = state_graph(certificate, limit=state_limit)
    if states is not None:
        graphs.append(
            ("states", state_graph_dot(certificate, states), state_graph_mermaid(certificate, states))
        )
    for kind, dot_text, mermaid_text in graphs:
        source = directory / f"{stem}.{kind}.dot"
        _write(source, dot_text)
        written.append(source)
        if dot is not None:
            written.extend(_dot_render(dot, source, ["svg", "png"] if png else ["svg"]))
        else:
            mermaid = directory / f"{stem}.{kind}.mmd"
            _write(mermaid, mermaid_text)
            written.append(mermaid)
    return GraphFiles(written, states is None, dot is not None)
