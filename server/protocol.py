"""The messages between the front and its partition workers: every command and every reply.

A frame (server/ipc.py) carries one `Request` or `Response` header and zero or
more Arrow relations; the relations a command takes, and the ones a reply
returns, are named in each class. A worker runs the commands it is sent in the
order they arrive, which is timestamp order (front/sequencer.py); a command
that carries `ts` runs at that global timestamp.

Both ends are processes of one server, started from the same code, so the
headers travel pickled. The command log never stores these classes: what it
keeps is described in partition/journal.py, in JSON (`TeSpec.to_log`,
`Span.to_log`), so that a log outlives a change of this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Mark = list[Any]
"""[producer id, stream, batch id]: the batch a command takes (as the command log stores it)."""


# ------------------------------------------------------------------ envelope
@dataclass(frozen=True)
class Request:
    """A command and its request id; `again`: sent a second time, after the worker that had it died."""

    id: int
    command: Command
    again: bool = False


@dataclass(frozen=True)
class Response:
    """The reply to request `id`: a reply body (below) or `Failed`."""

    id: int
    body: Any = None


@dataclass(frozen=True)
class Failed:
    """The command failed: a google.rpc code and a message naming what is wrong."""

    code: int
    message: str


# ------------------------------------------------------------------ commands
class Command:
    """Base of every command; `name` is how logs and errors call it."""

    name = "command"


@dataclass(frozen=True)
class TeSpec:
    """One TE a fragment runs: `procedure` over its input relation (None: the batch's plain append).

    `border`: it appends the pushed batch and fires the stream's EE triggers;
    `entry`: it consumes the pushed batch, so its abort rejects the batch.
    """

    procedure: str | None
    stream: str | None
    border: bool = False
    entry: bool = False

    def to_log(self) -> dict[str, Any]:
        return {"procedure": self.procedure, "stream": self.stream, "border": self.border, "entry": self.entry}

    @classmethod
    def from_log(cls, d: dict[str, Any]) -> TeSpec:
        return cls(d["procedure"], d["stream"], d["border"], d["entry"])


@dataclass(frozen=True)
class Push(Command):
    """Take one atomic batch (relation: its rows). Replies `Outcome`."""

    name = "push"
    stream: str
    producer: str
    batch_id: int
    ts: int


@dataclass(frozen=True)
class PushRun(Command):
    """Take consecutive batches of one producer on one stream, each as a `Push` of its own: batch ids
    `first_batch_id`.., timestamps `first_ts`.. (relation: their rows, `rows` per batch). Replies
    `RunReplies` as the batches' outcomes are known: one request for what a producer packed into one
    message, instead of a request, a future and a reply header each."""

    name = "push"
    stream: str
    producer: str
    first_batch_id: int
    first_ts: int
    rows: list[int]


@dataclass(frozen=True)
class Reject(Command):
    """Record a batch the front found bad as rejected, using up its id. Replies `Outcome`."""

    name = "reject"
    stream: str
    producer: str
    batch_id: int
    ts: int
    code: int
    reason: str


@dataclass(frozen=True)
class Call(Command):
    """Run an OLTP procedure local to this partition. Replies `Outcome`, relations: its result tables."""

    name = "call"
    procedure: str
    params: dict[str, Any]
    ts: int


@dataclass(frozen=True)
class Fragment(Command):
    """This partition's TEs of one step of a coordinated command (relations: each TE's input, then
    `exchange`'s rows), left open for `Decide` unless `autocommit`.

    Replies `FragmentRan`, `FragmentAborted`, or `Outcome` (DUPLICATE: `push` was taken before).
    """

    name = "fragment"
    ts: int
    tes: tuple[TeSpec, ...]
    params: dict[str, Any] | None = None
    push: Mark | None = None  # the batch the entry TEs take
    exchange: dict[str, Any] | None = None  # merged state rows of a state TE (partition/exchange.py)
    autocommit: bool = False  # the TE runs on this partition alone: commit it at once, with `mark`
    mark: Mark | None = None


@dataclass(frozen=True)
class Decide(Command):
    """Commit or undo the open coordinated transaction at `ts`; record `mark`, or `rejection`
    ([producer, stream, batch id, code, reason]) if the batch was rejected. Replies None."""

    name = "decide"
    commit: bool
    ts: int
    mark: Mark | None = None
    rejection: list[Any] | None = None


@dataclass(frozen=True)
class Done(Command):
    """(Home partition) the coordinated command at `ts` finished everywhere: log it. Replies None."""

    name = "done"
    ts: int


@dataclass(frozen=True)
class Migrate(Command):
    """Step of a migration at `ts` (partition/migration.py): open its transaction, take out the rows the new
    `map` (JSON) places on other partitions. Replies `Leaving`, relations: those rows."""

    name = "migrate"
    ts: int
    map: str


@dataclass(frozen=True)
class MigrateIn(Command):
    """The rows of a migration step at `ts` that move to this partition: relation i holds rows of
    `tables[i]`. Replies None; the step's `Decide` follows."""

    name = "migrate_in"
    ts: int
    tables: tuple[str, ...]


@dataclass(frozen=True)
class StateRead(Command):
    """Round 1 of state TEs spanning partitions: the rows this partition holds of the keys the events
    name. `items`: each batch's (procedure, ts); relations: the batches, joined (`runs`). Replies `StateRows`."""

    name = "state_read"
    items: list[tuple[str, int]]
    runs: list[list[int]]


@dataclass(frozen=True)
class Span(Command):
    """State batches of one punctuation interval over several partitions, left open for `Decide`.

    `pushes`: [stream, producer, batch id, ts, involved partitions] per batch;
    relations: the batches joined (`runs`), then `exchange`'s rows. Replies `SpanRan`.
    """

    name = "span"
    pushes: list[list[Any]]
    runs: list[list[int]]
    exchange: dict[str, Any]

    def to_log(self) -> dict[str, Any]:
        return {"pushes": self.pushes, "runs": self.runs, "exchange": self.exchange}

    @classmethod
    def from_log(cls, d: dict[str, Any]) -> Span:
        return cls(d["pushes"], d["runs"], d["exchange"])


@dataclass(frozen=True)
class Flow(Command):
    """One stage of a flow (front/flows.py): batches whose dataflow runs in two stages, left open for `Decide`.

    `stage` "entry": this partition owns each batch's keys and runs only its
    entry TEs, returning what they emitted. `stage` "rest" (home partition):
    every batch in timestamp order, whole if it owns it, else from what its
    entry emitted. A flow sends its batches in steps, each a stage message;
    a partition runs all of a flow's steps in one transaction, and answers a
    step that comes after it cut the flow with `cut` 0, running nothing.
    `items`: [stream, producer, batch id, ts, streams] per batch (per row, for a FOR EACH ROW batch:
    its rows follow each other, all in one step),
    `streams` None for a batch taken whole (relation: its rows), else the
    streams its entry emitted (relations: their tuples, in that order); the
    relations travel grouped (`ipc.join_grouped`: `order`, `runs`). Replies `FlowRan`.
    """

    name = "flow"
    stage: str
    items: list[list[Any]]
    order: list[int]
    runs: list[list[int]]
    epoch: int = 0  # the flow's first timestamp: its stages on one partition share one transaction
    first: bool = True  # this partition's first stage of the flow: it begins the transaction

    def to_log(self) -> dict[str, Any]:
        return {"stage": self.stage, "items": self.items, "order": self.order, "runs": self.runs}

    @classmethod
    def from_log(cls, d: dict[str, Any]) -> Flow:
        return cls(d["stage"], d["items"], d["order"], d["runs"])


@dataclass(frozen=True)
class Query(Command):
    """A read-only statement over this partition's tables. Replies None; relation: the result."""

    name = "query"
    sql: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Gather(Command):
    """Scatter/gather: `reads` is [[key], sql] per relation wanted. Replies `Gathered`; relations: each result."""

    name = "gather"
    reads: list[list[Any]]


@dataclass(frozen=True)
class ReadStream(Command):
    """Stored batches of a stream nothing consumes, from a timestamp on. Replies `StreamBatches`."""

    name = "read_stream"
    stream: str
    from_ts: int
    max_batches: int


@dataclass(frozen=True)
class Install(Command):
    """Deploy: run the physical DDL and switch to the catalog (JSON). Replies None.

    `startup`: the front's own catalog at start-up (a worker that recovered it already keeps its own).
    `analyzed`: that catalog as the front analyzed it (a `Catalog`), so no worker analyzes it again
    (a third of a second for the voter); the JSON is what the command log keeps.
    """

    name = "install"
    catalog: str
    ddl: list[str]
    map: str | None = None
    startup: bool = False
    analyzed: Any = None


@dataclass(frozen=True)
class Checkpoint(Command):
    """Take an online checkpoint named `ts`. Replies `Checkpointed` once written."""

    name = "checkpoint"
    ts: int


@dataclass(frozen=True)
class Release(Command):
    """Every partition wrote checkpoint `ts`: older checkpoints and log records may go. Replies None."""

    name = "release"
    ts: int


@dataclass(frozen=True)
class RecoveryInfo(Command):
    """What this partition's data directory holds for recovery. Replies `Recoverable`."""

    name = "recovery_info"


@dataclass(frozen=True)
class Recover(Command):
    """Load checkpoint `checkpoint` (None: none) and replay the log; `done`: the coordinated commands
    that finished. Replies `Recovered`."""

    name = "recover"
    checkpoint: int | None
    done: list[int]


@dataclass(frozen=True)
class Original(Command):
    """A re-send: what this partition knows of the batch. Replies `Outcome` (DUPLICATE)."""

    name = "original"
    producer: str
    stream: str
    batch_id: int


@dataclass(frozen=True)
class ReadMarks(Command):
    """The last batch id taken per (producer, stream), and the clock. Replies `MarksRead`."""

    name = "marks"


@dataclass(frozen=True)
class Status(Command):
    """Counters, table sizes, `metrics` (partition/meter.py). Replies a dict (the Status document's partition entry)."""

    name = "status"


@dataclass(frozen=True)
class Explain(Command):
    """How each statement of `units` (procedures, or "trigger t") runs here. Replies `Explained`."""

    name = "explain"
    units: tuple[str, ...]


@dataclass(frozen=True)
class Echo(Command):
    """Returns its relations (bench ipc: the message path alone). Replies None."""

    name = "echo"


@dataclass(frozen=True)
class Shutdown(Command):
    """Finish what was sent, flush the log, exit. Replies None."""

    name = "shutdown"


# ------------------------------------------------------------------- replies
@dataclass
class Outcome:
    """What became of a batch or call: the one shape from the partition to the client's ack.

    `outcome` is committed | duplicate | rejected; for a duplicate, `original`
    is the first outcome (committed | rejected) and `ts`, `code`, `reason`
    are the first run's. `emitted`: streams that got stored tuples
    (subscribers are woken); `aborted_tes`: downstream TEs undone.
    """

    outcome: str
    ts: int
    code: int = 0
    reason: str = ""
    original: str = ""
    emitted: set[str] = field(default_factory=set)
    tes: int = 0
    aborted_tes: list[str] = field(default_factory=list)

    def first(self, ts: int) -> Outcome:
        """Run again after a restart and found DUPLICATE (its first run was durable): the first run's outcome."""
        if self.outcome != "duplicate":
            return self
        return Outcome(self.original, ts, self.code, self.reason, "", set(), 0, [])

    def quiet(self) -> Outcome:
        """The outcome of a batch answered without running: nothing emitted, no TE."""
        return Outcome(self.outcome, self.ts, self.code, self.reason, self.original, set(), 0, [])


@dataclass(frozen=True)
class RunReplies:
    """The replies to batches `first`, `first + 1`, .. (places in their `PushRun`): `Outcome` or `Failed` each."""

    first: int
    items: list[Any]


@dataclass(frozen=True)
class FragmentRan:
    """The fragment's TEs ran (open, or committed if `autocommit`); relations: the emitted streams'
    tuples (in `emitted` order), then the results of a call's statements (`result_ids`)."""

    emitted: list[str]
    stored: list[str]
    result_ids: list[int]


@dataclass(frozen=True)
class FragmentAborted:
    """A TE of the fragment aborted; the partition rolled its transaction back."""

    code: int
    reason: str


@dataclass(frozen=True)
class SpanRan:
    outcomes: list[Outcome]


@dataclass(frozen=True)
class FlowRan:
    """Each batch's outcome so far and the streams its entry emitted (stage "entry"; relations: their
    tuples, grouped by `order`/`runs`); or `cut`: the batch at that index must not run in this flow (a
    TE aborted, or its dataflow reaches another partition), and the partition rolled the flow back."""

    outcomes: list[Outcome]
    emitted: list[list[str]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    runs: list[list[int]] = field(default_factory=list)
    cut: int | None = None


@dataclass(frozen=True)
class Leaving:
    """Rows a migration step takes out of a partition: relation i goes to `parts[i]` = (partition, table)."""

    parts: list[tuple[int, str]]


@dataclass(frozen=True)
class StateRows:
    """Relations: the rows of each table in `tables`."""

    tables: list[str]


@dataclass(frozen=True)
class Gathered:
    keys: list[Any]


@dataclass(frozen=True)
class StreamBatches:
    """Relations: one per batch, named by its timestamp."""

    ts: list[int]


@dataclass(frozen=True)
class Checkpointed:
    path: str
    lsn: int
    ts: int
    bytes: int = 0  # the checkpoint's files, in all


@dataclass(frozen=True)
class Recoverable:
    checkpoints: list[int]
    done: list[int]
    last_ts: int


@dataclass(frozen=True)
class Recovered:
    """Replay's report; `checkpointed`/`taken` say which batch ids it holds (front.py `lost_batches`)."""

    checkpoint_lsn: int = 0
    replayed: int = 0
    seconds: float = 0.0
    checkpointed: dict[tuple[str, str], int] = field(default_factory=dict)
    taken: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    last_ts: int = 0  # the highest timestamp whose effects the partition holds again (checkpoint or replay)


@dataclass(frozen=True)
class StatementPlan:
    """One statement: compiled (`plan`, a step a line) or run in DuckDB (`reason`)."""

    unit: str
    index: int
    sql: str
    compiled: bool
    plan: str
    reason: str


@dataclass(frozen=True)
class Explained:
    statements: list[StatementPlan]


@dataclass(frozen=True)
class MarksRead:
    marks: dict[tuple[str, str], int]
    last_ts: int


COMMAND_STEPS = frozenset({Fragment, Decide, Done, StateRead, Span, Flow, Migrate, MigrateIn})
"""Rounds of a coordinated command or span: meaningful only inside it, so never sent again alone."""
RECOVERY = frozenset({RecoveryInfo, Recover, ReadMarks})
"""Commands that bring a new worker up: failed, not held, when it dies."""
TAKES_BATCH = frozenset({Push, PushRun, Reject, Fragment, Decide, Span, Flow, StateRead, Done, Migrate, MigrateIn})
"""Commands that take a batch (or are a step of one): a bug in one stops the worker (partition/worker.py)."""
