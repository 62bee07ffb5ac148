"""Parser for streamtx deploy scripts.

A deploy script is a list of CREATE/DROP statements for tables, streams, windows, procedures,
triggers, indexes and transaction groups. This module only does syntax: it splits the script
into statements and turns each one into a frozen dataclass. Standard SQL pieces (table bodies,
procedure statements) stay as text for DuckDB; checking names against the catalog happens
elsewhere.

A hand-written tokenizer is used instead of sqlglot because procedure bodies need BEGIN/END
and CASE/END matching, every token needs its script line, and types must keep the user's
spelling (sqlglot rewrites VARCHAR(10) to TEXT and silently accepts "INT INT").
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

__all__ = [
    "Column",
    "CreateGroup",
    "CreateIndex",
    "CreateProcedure",
    "CreateStream",
    "CreateTable",
    "CreateTrigger",
    "CreateWindow",
    "DdlError",
    "Drop",
    "Param",
    "Statement",
    "parse_script",
    "split_sql",
]


@dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True)
class CreateTable:
    name: str
    sql: str
    partition_by: str | None
    if_not_exists: bool
    line: int
    replicated: bool = False


@dataclass(frozen=True)
class CreateStream:
    name: str
    columns: tuple[Column, ...]
    partition_by: str | None
    if_not_exists: bool
    line: int


@dataclass(frozen=True)
class CreateWindow:
    name: str
    stream: str
    kind: str
    size: int
    slide: int
    if_not_exists: bool
    line: int


@dataclass(frozen=True)
class Param:
    name: str
    type: str


@dataclass(frozen=True)
class CreateProcedure:
    name: str
    params: tuple[Param, ...]
    on_stream: str | None
    partition_on: str | None
    body: tuple[str, ...]
    python: str | None
    or_replace: bool
    line: int
    body_lines: tuple[int, ...]
    partition_on_columns: tuple[str, ...] = ()
    """`PARTITION ON (a, b, ...)`: the event columns holding a state procedure's keys (ON STREAM only)."""
    each_row: bool = False
    """`FOR EACH ROW`: a TE per tuple of the input batch, each followed by the TEs it triggers (ON STREAM only)."""


@dataclass(frozen=True)
class CreateTrigger:
    name: str
    target_kind: str
    target: str
    body: tuple[str, ...]
    or_replace: bool
    line: int
    body_lines: tuple[int, ...]


@dataclass(frozen=True)
class CreateIndex:
    name: str
    sql: str
    line: int


@dataclass(frozen=True)
class CreateView:
    name: str
    query: str  # the SELECT ... GROUP BY the view keeps
    line: int


@dataclass(frozen=True)
class CreateGroup:
    name: str
    procedures: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Drop:
    kind: str
    name: str
    if_exists: bool
    line: int


Statement = (
    CreateTable
    | CreateStream
    | CreateWindow
    | CreateProcedure
    | CreateTrigger
    | CreateIndex
    | CreateView
    | CreateGroup
    | Drop
)


class DdlError(Exception):
    """A syntax error in a deploy script.

    ``message`` names the statement and what is wrong; ``line`` (1-based) and ``column``
    (1-based, 0 when the whole statement is at fault) locate it. ``str(e)`` is
    ``"line L: message"``, followed by ``" (at column C)"`` when the column is known.
    """

    def __init__(self, message: str, line: int, column: int = 0) -> None:
        super().__init__(message, line, column)
        self.message = message
        self.line = line
        self.column = column

    def __str__(self) -> str:
        text = f"line {self.line}: {self.message}"
        if self.column > 0:
            text += f" (at column {self.column})"
        return text


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # word | qident | string | number | param | op
    text: str
    start: int
    end: int
    line: int
    col: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    def is_op(self, ch: str) -> bool:
        return self.kind == "op" and self.text == ch


_WS = re.compile(r"\s+")
_WORD = re.compile(r"[^\W\d]\w*")
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DOLLAR_TAG = re.compile(r"\$(?:[^\W\d]\w*)?\$")
_PARAM = re.compile(r"\$\w+")


def _tokenize(text: str) -> tuple[list[_Tok], DdlError | None]:
    """Tokens of ``text`` up to the first lexical error, and that error (or None).

    The error is returned rather than raised so statements before it are still reported first.
    """
    newlines = [m.start() for m in re.finditer("\n", text)]

    def loc(offset: int) -> tuple[int, int]:
        k = bisect.bisect_left(newlines, offset)
        line_start = newlines[k - 1] + 1 if k else 0
        return k + 1, offset - line_start + 1

    def fail(what: str, offset: int) -> DdlError:
        line, col = loc(offset)
        return DdlError(f"unterminated {what} starting at line {line}", line, col)

    toks: list[_Tok] = []

    def add(kind: str, start: int, end: int) -> None:
        line, col = loc(start)
        toks.append(_Tok(kind, text[start:end], start, end, line, col))

    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                return toks, fail("comment", i)
            i = j + 2
        elif c in "'\"":
            j = i + 1
            while True:
                k = text.find(c, j)
                if k < 0:
                    what = "string literal" if c == "'" else "quoted identifier"
                    return toks, fail(what, i)
                if text.startswith(c + c, k):
                    j = k + 2
                    continue
                break
            if c == '"' and k == i + 1:
                line, col = loc(i)
                return toks, DdlError('empty quoted identifier ""', line, col)
            add("string" if c == "'" else "qident", i, k + 1)
            i = k + 1
        elif c == "$" and (m := _DOLLAR_TAG.match(text, i)):
            k = text.find(m.group(), m.end())
            if k < 0:
                return toks, fail("dollar-quoted string", i)
            add("string", i, k + len(m.group()))
            i = k + len(m.group())
        elif c == "$" and (m := _PARAM.match(text, i)):
            add("param", i, m.end())
            i = m.end()
        elif m := _WORD.match(text, i):
            add("word", i, m.end())
            i = m.end()
        elif m := _NUMBER.match(text, i):
            add("number", i, m.end())
            i = m.end()
        else:
            add("op", i, i + 1)
            i += 1
    return toks, None


def _ident(tok: _Tok) -> str:
    if tok.kind == "qident":
        return tok.text[1:-1].replace('""', '"')
    return tok.text.lower()


def _show_name(tok: _Tok) -> str:
    return tok.text if tok.kind == "qident" else tok.text.lower()


def _show(tok: _Tok | None) -> str:
    if tok is None:
        return "end of statement"
    return tok.text if len(tok.text) <= 40 else tok.text[:37] + "..."


def split_sql(text: str) -> list[tuple[str, int]]:
    """Splits plain SQL (no BEGIN..END blocks) on top-level ';' respecting quotes and comments.

    Returns (statement, start line) pairs; empty statements are dropped and the trailing ';' is
    stripped. Leading and trailing comments of a statement are not part of its text.
    """
    toks, err = _tokenize(text)
    if err is not None:
        raise err
    out: list[tuple[str, int]] = []
    start = 0
    for i, tok in enumerate([*toks, None]):
        if tok is None or tok.is_op(";"):
            if i > start:
                out.append((text[toks[start].start : toks[i - 1].end], toks[start].line))
            start = i + 1
    return out


# --------------------------------------------------------------------------- splitter


@dataclass
class _Raw:
    tokens: list[_Tok]
    what: str  # e.g. "CREATE PROCEDURE vote", used to prefix error messages
    begin: int | None = None  # index of the body's BEGIN in tokens
    body: tuple[tuple[str, int], ...] = ()


_UNSUPPORTED_TAIL = (
    "a deploy script holds CREATE/DROP of tables, streams, windows, procedures, triggers, indexes and views"
)


def _describe(toks: list[_Tok]) -> str:
    if not toks or toks[0].upper not in ("CREATE", "DROP"):
        return " ".join(t.text for t in toks[:3])
    parts = [toks[0].upper]
    k = 1

    def at(*words: str) -> bool:
        return all(k + j < len(toks) and toks[k + j].upper == w for j, w in enumerate(words))

    if at("OR", "REPLACE"):
        k += 2
    for word in ("UNIQUE", "TRANSACTION"):
        if at(word):
            parts.append(word)
            k += 1
    if k < len(toks) and toks[k].kind == "word":
        parts.append(toks[k].upper)
        k += 1
    for words in (("IF", "NOT", "EXISTS"), ("IF", "EXISTS")):
        if at(*words):
            k += len(words)
    if k < len(toks) and toks[k].kind in ("word", "qident") and toks[k].upper not in _NOT_NAMES:
        parts.append(_show_name(toks[k]))
    return " ".join(parts)


def _is_block_header(toks: list[_Tok], i: int) -> bool:
    """True for CREATE [OR REPLACE] PROCEDURE|TRIGGER, the statements that may own BEGIN..END."""
    words = [t.upper for t in toks[i : i + 4]]
    if words[:1] != ["CREATE"]:
        return False
    if words[1:3] == ["OR", "REPLACE"]:
        return words[3:4] in (["PROCEDURE"], ["TRIGGER"])
    return words[1:2] in (["PROCEDURE"], ["TRIGGER"])


def _keyword(toks: list[_Tok], j: int) -> str:
    """Upper-cased keyword at j, or '' when it is a qualified name part such as t.end."""
    if j > 0 and toks[j - 1].is_op("."):
        return ""
    return toks[j].upper


def _scan_body(
    text: str, toks: list[_Tok], begin: int, what: str, line: int, lex_err: DdlError | None
) -> tuple[list[tuple[str, int]], int]:
    """Statements between BEGIN at ``begin`` and its END, and the index of that END."""
    body: list[tuple[str, int]] = []
    cases: list[_Tok] = []
    start: int | None = None
    j = begin + 1
    while j < len(toks):
        tok = toks[j]
        word = _keyword(toks, j)
        if (word == "END" and not cases) or tok.is_op(";"):
            if tok.is_op(";") and cases:
                raise DdlError(
                    f"{what}: CASE at line {cases[-1].line} has no END before ';'",
                    tok.line,
                    tok.col,
                )
            if start is not None:
                body.append((text[toks[start].start : toks[j - 1].end], toks[start].line))
                start = None
            if word == "END":
                return body, j
            j += 1
            continue
        if word == "CASE":
            cases.append(tok)
        elif word == "END":
            cases.pop()
        elif word == "BEGIN":
            raise DdlError(
                f"{what}: nested BEGIN at line {tok.line} is not allowed; a body is a single BEGIN ... END block",
                tok.line,
                tok.col,
            )
        if start is None:
            start = j
        j += 1
    if lex_err is not None:
        raise lex_err
    raise DdlError(f"{what}: missing END for BEGIN at line {toks[begin].line}", line)


def _split_script(text: str) -> Iterator[_Raw]:
    """Yields raw statements in order, so an earlier statement's error wins over a later one."""
    toks, lex_err = _tokenize(text)
    i, n = 0, len(toks)
    while i < n:
        if toks[i].is_op(";"):
            i += 1
            continue
        block = _is_block_header(toks, i)
        depth = 0
        begin = None
        j = i
        while j < n and not toks[j].is_op(";"):
            if toks[j].is_op("("):
                depth += 1
            elif toks[j].is_op(")"):
                depth -= 1
            elif block and depth <= 0 and _keyword(toks, j) == "BEGIN":
                begin = j
                break
            j += 1
        what = _describe(toks[i:j])
        if begin is None:
            if j >= n and lex_err is not None:
                raise lex_err
            yield _Raw(toks[i:j], what)
            i = j + 1
            continue
        body, end = _scan_body(text, toks, begin, what, toks[i].line, lex_err)
        after = toks[end + 1] if end + 1 < n else None
        if after is not None and not after.is_op(";"):
            raise DdlError(f"{what}: expected ';' after END, found {_show(after)}", after.line, after.col)
        yield _Raw(toks[i : end + 1], what, begin - i, tuple(body))
        i = end + 2
    if lex_err is not None:
        raise lex_err


# --------------------------------------------------------------------------- statement parser

_NOT_NAMES = frozenset({"AS", "BEGIN", "END", "ON"})
_CONSTRAINTS = {
    "PRIMARY": "PRIMARY KEY",
    "NOT": "NOT NULL",
    "NULL": "NULL",
    "DEFAULT": "DEFAULT",
    "UNIQUE": "UNIQUE",
    "CHECK": "CHECK",
    "REFERENCES": "REFERENCES",
    "CONSTRAINT": "CONSTRAINT",
    "GENERATED": "GENERATED",
    "AS": "AS",
    "COLLATE": "COLLATE",
}
_TABLE_CONSTRAINTS = {
    "PRIMARY": "PRIMARY KEY",
    "FOREIGN": "FOREIGN KEY",
    "UNIQUE": "UNIQUE",
    "CHECK": "CHECK",
    "CONSTRAINT": "CONSTRAINT",
}
_TYPE_OPS = frozenset("()[],.")
_NO_SPACE_AFTER = frozenset("([.")
_NO_SPACE_BEFORE = frozenset(")],([.")
_PYTHON_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
_DROP_KINDS = {
    "TABLE": "table",
    "STREAM": "stream",
    "WINDOW": "window",
    "PROCEDURE": "procedure",
    "TRIGGER": "trigger",
    "INDEX": "index",
    "VIEW": "view",
    "GROUP": "group",
}
_AS_BODY = "expected AS BEGIN ... END or AS PYTHON 'module:function'"
_CURRENT = object()
_END = object()
_STMT = object()


class _Cursor:
    def __init__(self, raw: _Raw, text: str) -> None:
        self.raw = raw
        self.toks = raw.tokens
        self.text = text
        self.pos = 0
        self.line = self.toks[0].line

    def peek(self, k: int = 0) -> _Tok | None:
        idx = self.pos + k
        return self.toks[idx] if idx < len(self.toks) else None

    def at(self, *words: str) -> bool:
        return all((t := self.peek(k)) is not None and t.upper == w for k, w in enumerate(words))

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.pos += len(words)
            return True
        return False

    def expect(self, *words: str, after: str = "") -> None:
        if not self.accept(*words):
            self.fail(f"expected {' '.join(words)}{after}, found {_show(self.peek())}")

    def at_op(self, ch: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.is_op(ch)

    def fail(self, message: str, at: object = _CURRENT) -> NoReturn:
        """Raises at token ``at``; the current token by default, the whole statement for _STMT."""
        if at is _CURRENT:
            at = self.peek() or _END
        if isinstance(at, _Tok):
            raise DdlError(f"{self.raw.what}: {message}", at.line, at.col)
        line = self.toks[-1].line if at is _END else self.line
        raise DdlError(f"{self.raw.what}: {message}", line)

    def name(self, what: str) -> str:
        tok = self.peek()
        if tok is None or tok.kind not in ("word", "qident") or tok.upper in _NOT_NAMES:
            self.fail(f"expected {what}, found {_show(tok)}")
        self.pos += 1
        return _ident(tok)

    def finish(self) -> None:
        if (tok := self.peek()) is not None:
            self.fail(f"unexpected {_show(tok)}")

    def group(self, after: str) -> tuple[list[_Tok], _Tok, _Tok]:
        """Consumes '( ... )' and returns the tokens inside plus both parentheses."""
        if not self.at_op("("):
            self.fail(f"expected ( {after}, found {_show(self.peek())}")
        open_ = self.toks[self.pos]
        depth = 0
        for j in range(self.pos, len(self.toks)):
            if self.toks[j].is_op("("):
                depth += 1
            elif self.toks[j].is_op(")"):
                depth -= 1
                if depth == 0:
                    inner = self.toks[self.pos + 1 : j]
                    self.pos = j + 1
                    return inner, open_, self.toks[j]
        self.fail(f"missing ) for the ( at line {open_.line}", open_)

    def positive_int(self, label: str) -> int:
        tok = self.peek()
        if tok is None or tok.kind != "number" or not tok.text.isdigit() or int(tok.text) == 0:
            self.fail(f"{label} expects a positive integer, found {_show(tok)}")
        self.pos += 1
        return int(tok.text)

    def partition_by(self) -> str | None:
        if not self.accept("PARTITION"):
            return None
        self.expect("BY", after=" after PARTITION")
        if self.at_op("("):
            inner, open_, _ = self.group("")
            if len(inner) != 1 or inner[0].kind not in ("word", "qident"):
                self.fail("PARTITION BY takes exactly one column, e.g. PARTITION BY (id)", open_)
            return _ident(inner[0])
        return self.name("a column after PARTITION BY")

    def text_of(self, first: _Tok, last: _Tok) -> str:
        return self.text[first.start : last.end]


def _split_commas(toks: list[_Tok]) -> list[tuple[list[_Tok], _Tok | None]]:
    """Top-level comma-separated items, each with the comma that ends it (None for the last)."""
    items: list[tuple[list[_Tok], _Tok | None]] = []
    cur: list[_Tok] = []
    depth = 0
    for tok in toks:
        if tok.kind == "op" and tok.text in "([":
            depth += 1
        elif tok.kind == "op" and tok.text in ")]":
            depth -= 1
        elif depth == 0 and tok.is_op(","):
            items.append((cur, tok))
            cur = []
            continue
        cur.append(tok)
    items.append((cur, None))
    return items


def _type_sql(toks: list[_Tok]) -> str:
    """Type text normalized to upper case and single spaces; STRUCT/UNION field names keep case."""
    out: list[str] = []
    struct_parens: list[bool] = []
    prev: _Tok | None = None
    for tok in toks:
        is_field = (
            bool(struct_parens) and struct_parens[-1] and prev is not None and (prev.is_op("(") or prev.is_op(","))
        )
        piece = tok.text.upper() if tok.kind == "word" and not is_field else tok.text
        if (
            prev is not None
            and not (prev.kind == "op" and prev.text in _NO_SPACE_AFTER)
            and not (tok.kind == "op" and tok.text in _NO_SPACE_BEFORE)
        ):
            out.append(" ")
        out.append(piece)
        if tok.is_op("("):
            struct_parens.append(prev is not None and prev.upper in ("STRUCT", "UNION"))
        elif tok.is_op(")") and struct_parens:
            struct_parens.pop()
        prev = tok
    return "".join(out)


def _typed_names(c: _Cursor, inner: list[_Tok], noun: str, rule: str, close: _Tok) -> list[tuple[str, str]]:
    """Parses 'name TYPE, ...' (stream columns, procedure parameters); constraints are errors."""
    if not inner:
        return []
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item, comma in _split_commas(inner):
        if not item:
            c.fail(f"empty {noun} definition", comma or close)
        first = item[0]
        label = _TABLE_CONSTRAINTS.get(first.upper)
        if label and len(item) > 1 and (item[1].upper == "KEY" or item[1].is_op("(")):
            c.fail(f"table constraint {label} is not allowed; {rule}", first)
        if first.upper == "CONSTRAINT":
            c.fail(f"table constraint CONSTRAINT is not allowed; {rule}", first)
        if first.kind not in ("word", "qident"):
            c.fail(f"expected a {noun} name, found {_show(first)}", first)
        name = _ident(first)
        type_toks = item[1:]
        if not type_toks:
            c.fail(f'{noun} "{name}" has no type', first)
        depth = 0
        for tok in type_toks:
            if tok.kind == "op" and tok.text in "([":
                depth += 1
            elif tok.kind == "op" and tok.text in ")]":
                depth -= 1
            elif depth == 0 and tok.upper in _CONSTRAINTS:
                constraint = _CONSTRAINTS[tok.upper]
                c.fail(f'{noun} "{name}" has a constraint ({constraint}); {rule}', tok)
            if tok.kind == "op" and tok.text not in _TYPE_OPS:
                c.fail(f'unexpected {_show(tok)} in the type of {noun} "{name}"', tok)
        if type_toks[0].kind != "word":
            c.fail(f'{noun} "{name}": expected a type, found {_show(type_toks[0])}', type_toks[0])
        if name in seen:
            c.fail(f'duplicate {noun} "{name}"', first)
        seen.add(name)
        out.append((name, _type_sql(type_toks)))
    return out


def _unsupported(raw: _Raw) -> NoReturn:
    toks = raw.tokens
    words: list[str] = []
    for tok in toks[:3]:
        if tok.is_op("("):
            break
        words.append(tok.text)
    line = toks[0].line
    raise DdlError(f"unsupported statement at line {line}: {' '.join(words)}; {_UNSUPPORTED_TAIL}", line)


def _parse_table(c: _Cursor) -> CreateTable:
    if_not_exists = c.accept("IF", "NOT", "EXISTS")
    name = c.name("a table name")
    inner, open_, close = c.group("column definitions ) after the table name")
    if not inner:
        c.fail("the column list is empty", open_)
    partition = c.partition_by()
    replicated = partition is None and c.accept("REPLICATED")
    if replicated and c.at("PARTITION"):
        c.fail("a table is either REPLICATED or PARTITION BY a column, not both")
    c.finish()
    return CreateTable(name, c.text_of(c.toks[0], close), partition, if_not_exists, c.line, replicated)


def _parse_stream(c: _Cursor) -> CreateStream:
    if_not_exists = c.accept("IF", "NOT", "EXISTS")
    name = c.name("a stream name")
    inner, open_, close = c.group("col TYPE, ... ) after the stream name")
    rule = "stream columns take a name and a type only"
    columns = _typed_names(c, inner, "column", rule, close)
    if not columns:
        c.fail("the column list is empty", open_)
    partition = c.partition_by()
    c.finish()
    cols = tuple(Column(n, t) for n, t in columns)
    return CreateStream(name, cols, partition, if_not_exists, c.line)


def _parse_window(c: _Cursor) -> CreateWindow:
    if_not_exists = c.accept("IF", "NOT", "EXISTS")
    name = c.name("a window name")
    c.expect("ON", after=" after the window name")
    nxt = c.peek(1)
    if c.at("STREAM") and nxt is not None and nxt.upper not in ("ROWS", "RANGE"):
        c.pos += 1
    stream = c.name("a stream name after ON")
    if c.accept("ROWS"):
        kind = "rows"
    elif c.accept("RANGE"):
        kind = "range"
    else:
        c.fail(f"expected ROWS n or RANGE t after the stream name, found {_show(c.peek())}")
    size = c.positive_int(kind.upper())
    c.expect("SLIDE", after=f" after {kind.upper()} {size}")
    slide = c.positive_int("SLIDE")
    c.finish()
    if slide > size:
        c.fail(f"SLIDE {slide} is larger than {kind.upper()} {size}", _STMT)
    return CreateWindow(name, stream, kind, size, slide, if_not_exists, c.line)


def _body(c: _Cursor) -> tuple[tuple[str, ...], tuple[int, ...]]:
    begin = c.peek()
    if not c.at("BEGIN") or c.raw.begin != c.pos:
        c.fail(f"{_AS_BODY}, found {_show(begin)}")
    if not c.raw.body:
        c.fail(f"empty body: BEGIN at line {begin.line} has no statements before END", begin)
    c.pos = len(c.toks)
    return tuple(s for s, _ in c.raw.body), tuple(n for _, n in c.raw.body)


def _parse_procedure(c: _Cursor, or_replace: bool) -> CreateProcedure:
    name = c.name("a procedure name")
    params: list[tuple[str, str]] = []
    if c.at_op("("):
        inner, _, close = c.group("")
        rule = "parameters take a name and a type only"
        params = _typed_names(c, inner, "parameter", rule, close)
    on_stream = partition_on = None
    columns: tuple[str, ...] = ()
    each_row = False
    while True:
        if c.at("ON"):
            if on_stream is not None:
                c.fail("ON STREAM is given twice")
            c.pos += 1
            c.expect("STREAM", after=" after ON")
            on_stream = c.name("a stream name after ON STREAM")
        elif c.at("PARTITION"):
            if partition_on is not None or columns:
                c.fail("PARTITION ON is given twice")
            c.pos += 1
            c.expect("ON", after=" after PARTITION")
            if c.at_op("("):
                columns = _name_list(c, "PARTITION ON")
            else:
                partition_on = c.name("a parameter name after PARTITION ON")
        elif c.at("FOR"):
            if each_row:
                c.fail("FOR EACH ROW is given twice")
            c.pos += 1
            c.expect("EACH", after=" after FOR")
            c.expect("ROW", after=" after FOR EACH")
            each_row = True
        else:
            break
    if each_row and on_stream is None:
        c.fail("FOR EACH ROW needs ON STREAM: an OLTP procedure has no input rows")
    if columns and on_stream is None:
        if len(columns) > 1:
            c.fail(f"an OLTP procedure is PARTITION ON one parameter, not {len(columns)}")
        partition_on, columns = columns[0], ()
    if not c.accept("AS"):
        c.fail(f"{_AS_BODY}, found {_show(c.peek())}")
    python = None
    body: tuple[str, ...] = ()
    lines: tuple[int, ...] = ()
    if c.accept("PYTHON"):
        tok = c.peek()
        ref = tok.text[1:-1] if tok is not None and tok.text.startswith("'") else None
        if ref is None or not _PYTHON_REF.fullmatch(ref):
            c.fail(f"AS PYTHON expects a string 'module:function', found {_show(tok)}")
        c.pos += 1
        python = ref
    else:
        body, lines = _body(c)
    c.finish()
    ps = tuple(Param(n, t) for n, t in params)
    return CreateProcedure(
        name, ps, on_stream, partition_on, body, python, or_replace, c.line, lines, columns, each_row
    )


def _name_list(c: _Cursor, after: str) -> tuple[str, ...]:
    """`(a, b, ...)`: one or more distinct names."""
    inner, open_, close = c.group(f"after {after}")
    return _distinct_names(
        c,
        inner,
        open_,
        close,
        expected=f"{after} lists column names",
        twice=f'{after} lists column "{{name}}" twice',
        empty=f"{after} () lists no column",
    )


def _distinct_names(
    c: _Cursor, inner: list[_Tok], open_: _Tok, close: _Tok, *, expected: str, twice: str, empty: str
) -> tuple[str, ...]:
    """The distinct names of a parenthesized list; the messages say what the list holds."""
    names: list[str] = []
    for item, comma in _split_commas(inner) if inner else ():
        if len(item) != 1 or item[0].kind not in ("word", "qident"):
            bad = item[1] if len(item) > 1 else item[0] if item else comma or close
            c.fail(f"{expected}, found {_show(bad)}", bad)
        name = _ident(item[0])
        if name in names:
            c.fail(twice.format(name=name), item[0])
        names.append(name)
    if not names:
        c.fail(empty, open_)
    return tuple(names)


def _parse_trigger(c: _Cursor, or_replace: bool) -> CreateTrigger:
    name = c.name("a trigger name")
    c.expect("ON", after=" after the trigger name")
    if c.accept("STREAM"):
        target_kind = "stream"
    elif c.accept("WINDOW"):
        target_kind = "window"
    else:
        c.fail(f"expected ON STREAM name or ON WINDOW name, found {_show(c.peek())}")
    target = c.name(f"a {target_kind} name")
    if not c.accept("AS"):
        c.fail(f"expected AS BEGIN ... END, found {_show(c.peek())}")
    body, lines = _body(c)
    c.finish()
    return CreateTrigger(name, target_kind, target, body, or_replace, c.line, lines)


def _parse_index(c: _Cursor) -> CreateIndex:
    c.expect("INDEX")
    c.accept("IF", "NOT", "EXISTS")
    if c.at("ON"):
        c.fail("an index needs a name: CREATE INDEX name ON table (columns)")
    name = c.name("an index name")
    c.expect("ON", after=" after the index name")
    if c.peek() is None:
        c.fail("expected a table name after ON, found end of statement")
    return CreateIndex(name, c.text_of(c.toks[0], c.toks[-1]), c.line)


def _parse_view(c: _Cursor) -> CreateView:
    name = c.name("a view name")
    c.expect("AS", after=" after the view name")
    if not c.at("SELECT"):
        c.fail(f"expected SELECT ... GROUP BY after AS, found {_show(c.peek())}")
    first = c.toks[c.pos]
    return CreateView(name, c.text_of(first, c.toks[-1]), c.line)


def _parse_group(c: _Cursor) -> CreateGroup:
    name = c.name("a group name")
    inner, open_, close = c.group("procedure, ... ) after the group name")
    procs = _distinct_names(
        c,
        inner,
        open_,
        close,
        expected="expected a procedure name",
        twice='procedure "{name}" is listed twice',
        empty="a transaction group lists at least one procedure",
    )
    c.finish()
    return CreateGroup(name, procs, c.line)


def _parse_drop(c: _Cursor) -> Drop:
    if c.accept("TRANSACTION"):
        c.expect("GROUP", after=" after DROP TRANSACTION")
        kind = "group"
    else:
        tok = c.peek()
        kind = _DROP_KINDS.get(tok.upper if tok is not None else "", "")
        if not kind:
            _unsupported(c.raw)
        c.pos += 1
    if_exists = c.accept("IF", "EXISTS")
    name = c.name(f"a {kind} name")
    c.finish()
    return Drop(kind, name, if_exists, c.line)


def _parse(raw: _Raw, text: str) -> Statement:
    c = _Cursor(raw, text)
    if c.accept("DROP"):
        return _parse_drop(c)
    if not c.accept("CREATE"):
        _unsupported(raw)
    or_replace_tok = c.peek()
    or_replace = c.accept("OR", "REPLACE")
    if c.accept("UNIQUE") or c.at("INDEX"):
        kind = "INDEX"
    elif c.accept("TRANSACTION", "GROUP"):
        kind = "GROUP"
    elif c.accept("MATERIALIZED", "VIEW"):
        kind = "VIEW"
    elif any(c.at(k) for k in ("TABLE", "STREAM", "WINDOW", "PROCEDURE", "TRIGGER", "VIEW")):
        kind = c.toks[c.pos].upper
        c.pos += 1
    else:
        _unsupported(raw)
    if or_replace and kind not in ("PROCEDURE", "TRIGGER"):
        c.fail("OR REPLACE is only supported for procedures and triggers", or_replace_tok)
    if kind == "PROCEDURE":
        return _parse_procedure(c, or_replace)
    if kind == "TRIGGER":
        return _parse_trigger(c, or_replace)
    return _PARSERS[kind](c)


_PARSERS = {
    "TABLE": _parse_table,
    "STREAM": _parse_stream,
    "WINDOW": _parse_window,
    "INDEX": _parse_index,
    "VIEW": _parse_view,
    "GROUP": _parse_group,
}


def parse_script(script: str) -> list[Statement]:
    """Parses a deploy script into statements, in script order.

    Raises DdlError for the first syntax error; nothing is checked against the catalog.
    """
    return [_parse(raw, script) for raw in _split_script(script)]
