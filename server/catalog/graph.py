"""The dataflow graph: which procedures and EE triggers consume, and emit on, which streams.

Derived from the definitions and from the streams each plan emits on. It
orders a command's TEs (topological rank), tells where a stream's tuples can
go (emitted_by, reaches_each_row), and checks that each transaction group can
run as one unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamtx.errors import InvalidArgument
from streamtx.server.catalog.compile import referenced_names
from streamtx.server.catalog.defs import GroupDef, ProcedureDef, StreamDef, TriggerDef, WindowDef


def retained(
    streams: Iterable[str], procedures: Iterable[ProcedureDef], triggers: Iterable[TriggerDef]
) -> frozenset[str]:
    """Streams no procedure or EE trigger consumes: their batches are stored for Subscribe."""
    consumed = {p.on_stream for p in procedures}
    triggered = {t.target for t in triggers if t.target_kind == "stream"}
    return frozenset(set(streams) - triggered - consumed)


def window_owners(
    windows: Mapping[str, WindowDef], streams: Mapping[str, StreamDef], procedures: Mapping[str, ProcedureDef]
) -> dict[str, str]:
    """Each window belongs to one procedure: the consumer of its stream that uses it.

    The owner's TEs feed the window with their input batch and are the only
    code (with the window's EE triggers) that may read it.
    """
    owner: dict[str, str] = {}
    for w in windows.values():
        if w.stream not in streams:
            raise InvalidArgument(f"deploy: window {w.name!r} is on unknown stream {w.stream!r}")
        if w.kind == "range" and "ts" not in dict(streams[w.stream].columns):
            raise InvalidArgument(
                f"deploy: window {w.name!r}: RANGE windows need a 'ts BIGINT' column on stream {w.stream!r}"
            )
        consumers = sorted(p.name for p in procedures.values() if p.on_stream == w.stream)
        if len(consumers) > 1:
            consumers = [p for p in consumers if any(w.name in referenced_names(st) for st in procedures[p].body)]
        if len(consumers) != 1:
            why = "no procedure consumes it" if not consumers else f"{', '.join(consumers)} all use it"
            raise InvalidArgument(
                f"deploy: window {w.name!r} on stream {w.stream!r} needs exactly one owner, the "
                f"procedure ON STREAM {w.stream} that uses it; {why}"
            )
        owner[w.name] = consumers[0]
    return owner


def owned_windows(window_owner: Mapping[str, str], procedure: str) -> list[str]:
    return sorted(w for w, owner in window_owner.items() if owner == procedure)


@dataclass(frozen=True)
class Dataflow:
    """The graph of one catalog, with what its queries need to walk it."""

    consumers: dict[str, list[str]] = field(default_factory=dict)
    """Stream -> the procedures ON STREAM it, in topological order."""
    producers_of: dict[str, list[str]] = field(default_factory=dict)
    """Stream -> the procedures whose own statements emit on it."""
    topo_rank: dict[str, int] = field(default_factory=dict)
    window_owner: dict[str, str] = field(default_factory=dict)
    emits: dict[str, frozenset[str]] = field(default_factory=dict)
    """Procedure -> the streams its own statements emit on."""
    trigger_emits: dict[str, frozenset[str]] = field(default_factory=dict)
    triggers: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(stream | window, its name) -> the EE triggers on it, by name."""
    windows_on: dict[str, list[str]] = field(default_factory=dict)
    each_row: frozenset[str] = frozenset()
    groups: dict[str, str] = field(default_factory=dict)
    """Procedure -> its transaction group."""

    def triggers_on(self, kind: str, target: str) -> list[str]:
        return list(self.triggers.get((kind, target), ()))

    def group_of(self, procedure: str) -> str | None:
        return self.groups.get(procedure)

    def owned_windows(self, procedure: str) -> list[str]:
        return owned_windows(self.window_owner, procedure)

    def is_border(self, stream: str) -> bool:
        """A border stream is fed from outside: no procedure or trigger emits on it."""
        return not self.producers_of.get(stream) and not any(stream in e for e in self.trigger_emits.values())

    def emitted_by(self, procedure: str) -> set[str]:
        """Streams a procedure's TE can emit on, directly or through EE triggers."""
        out = set(self.emits[procedure])
        todo = list(out)
        while todo:
            stream = todo.pop()
            for trig in self.triggers_on("stream", stream):
                for s in self.trigger_emits[trig] - out:
                    out.add(s)
                    todo.append(s)
        return out

    def reaches_each_row(self, streams: list[str]) -> bool:
        """Whether tuples on `streams` can reach a FOR EACH ROW procedure (then a command runs tuple by tuple)."""
        seen = set(streams)
        todo = list(streams)
        while todo:
            stream = todo.pop()
            if any(p in self.each_row for p in self.consumers.get(stream, [])):
                return True
            triggers = self.triggers_on("stream", stream)
            for w in self.windows_on.get(stream, []):
                triggers += self.triggers_on("window", w)
            out = {s for t in triggers for s in self.trigger_emits[t]}
            out |= {s for p in self.consumers.get(stream, []) for s in self.emitted_by(p)}
            todo += sorted(out - seen)
            seen |= out
        return False


def derive(
    streams: Iterable[str],
    procedures: Mapping[str, ProcedureDef],
    emits: Mapping[str, frozenset[str]],
    triggers: Mapping[str, TriggerDef],
    trigger_emits: Mapping[str, frozenset[str]],
    windows: Mapping[str, WindowDef],
    window_owner: dict[str, str],
    groups: Mapping[str, GroupDef],
) -> Dataflow:
    """The graph of procedures (by the streams `emits` says they emit on) and triggers; a cycle is InvalidArgument."""
    consumers: dict[str, list[str]] = {s: [] for s in streams}
    producers_of: dict[str, list[str]] = {s: [] for s in consumers}
    edges: dict[str, set[str]] = {}
    for proc in procedures.values():
        node = f"procedure {proc.name}"
        if proc.on_stream:
            consumers[proc.on_stream].append(proc.name)
            edges.setdefault(f"stream {proc.on_stream}", set()).add(node)
        for s in sorted(emits[proc.name]):
            producers_of[s].append(proc.name)
            edges.setdefault(node, set()).add(f"stream {s}")
    for trig in triggers.values():
        src = f"stream {trig.target}" if trig.target_kind == "stream" else f"window {trig.target}"
        if trig.target_kind == "window":
            w = windows[trig.target]
            edges.setdefault(f"stream {w.stream}", set()).add(src)
        for s in sorted(trigger_emits[trig.name]):
            edges.setdefault(src, set()).add(f"stream {s}")
    for s in consumers:
        consumers[s].sort()
    order = _toposort(edges)
    topo_rank = {n.split(" ", 1)[1]: i for i, n in enumerate(order) if n.startswith("procedure ")}
    for s in consumers:
        consumers[s].sort(key=lambda p: topo_rank.get(p, 0))
    by_target: dict[tuple[str, str], list[str]] = {}
    for trig in sorted(triggers.values(), key=lambda t: t.name):
        by_target.setdefault((trig.target_kind, trig.target), []).append(trig.name)
    windows_on: dict[str, list[str]] = {}
    for w in windows.values():
        windows_on.setdefault(w.stream, []).append(w.name)
    group_of: dict[str, str] = {}
    for g in groups.values():
        for p in g.procedures:
            group_of.setdefault(p, g.name)
    return Dataflow(
        consumers=consumers,
        producers_of=producers_of,
        topo_rank=topo_rank,
        window_owner=window_owner,
        emits=dict(emits),
        trigger_emits=dict(trigger_emits),
        triggers=by_target,
        windows_on=windows_on,
        each_row=frozenset(p.name for p in procedures.values() if p.each_row),
        groups=group_of,
    )


def check_groups(groups: Mapping[str, GroupDef], procedures: Mapping[str, ProcedureDef], flow: Dataflow) -> None:
    """A transaction group must be able to run as one unit, back to back.

    So no procedure outside it may depend on one member and feed another
    (it would have to run in the middle), and the procedures one stream
    feeds (taken or refused together per batch) may not span two groups.
    """
    owner: dict[str, str] = {}
    for group in groups.values():
        for p in group.procedures:
            if p not in procedures:
                raise InvalidArgument(f"deploy: transaction group {group.name!r} names unknown procedure {p!r}")
            if p in owner and owner[p] != group.name:
                raise InvalidArgument(f"deploy: procedure {p!r} is in two transaction groups: {owner[p]}, {group.name}")
            owner[p] = group.name
            if procedures[p].each_row:
                raise InvalidArgument(
                    f"deploy: procedure {p!r} is FOR EACH ROW, so it cannot be in transaction group "
                    f"{group.name!r}: each of its TEs takes one tuple; group the procedures downstream of it"
                )
    feeds: dict[str, set[str]] = {p: set() for p in procedures}
    for p in procedures:
        for stream in flow.emitted_by(p):
            feeds[p] |= set(flow.consumers.get(stream, []))
    reach = {p: _reachable(p, feeds) for p in procedures}
    for group in groups.values():
        members = set(group.procedures)
        for q in sorted(set(procedures) - members):
            before = sorted(m for m in members if q in reach[m])
            after = sorted(m for m in members if m in reach[q])
            if before and after:
                raise InvalidArgument(
                    f"deploy: transaction group {group.name!r} is split by procedure {q!r}, which runs after "
                    f"{before[0]} and before {after[0]}; add {q!r} to the group or regroup"
                )
    for stream, consumers in flow.consumers.items():
        names = sorted({owner[p] for p in consumers if p in owner})
        if len(names) > 1:
            raise InvalidArgument(
                f"deploy: stream {stream!r} feeds procedures of transaction groups {', '.join(names)}; the "
                "procedures of one stream are taken together per batch, so they can be in one group at most"
            )


def _reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(edges.get(n, ()))
    return seen


def _toposort(edges: dict[str, set[str]]) -> list[str]:
    """Kahn's algorithm with name order for ties; a cycle is InvalidArgument naming it."""
    nodes = set(edges) | {m for ms in edges.values() for m in ms}
    indeg = {n: 0 for n in nodes}
    for ms in edges.values():
        for m in ms:
            indeg[m] += 1
    ready = sorted(n for n, d in indeg.items() if d == 0)
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in sorted(edges.get(n, ())):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
                ready.sort()
    if len(order) != len(nodes):
        raise InvalidArgument(f"deploy: the dataflow graph has a cycle: {_find_cycle(edges)}")
    return order


def _find_cycle(edges: dict[str, set[str]]) -> str:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in color:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(edges):
        if n not in color:
            cycle = visit(n)
            if cycle:
                return " -> ".join(cycle)
    return "?"
