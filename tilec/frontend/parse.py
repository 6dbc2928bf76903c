"""Text -> lark parse tree, with lark's exceptions turned into located ParseErrors."""
from __future__ import annotations

import difflib
import functools
import re

import lark

from .._resources import resource
from ..errors import ParseError, Source, Span

# How an expected terminal is named in an error message.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "DTYPE": "a dtype",
    "CMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/' or '%'",
    "OR_OP": "'||'",
    "AND_OP": "'&&'",
    "NEG_OP": "'!'",
}
_EXPR_START = {"NAME", "INT", "FLOAT", "LPAR", "DTYPE"}
_OPERATORS = {"OR_OP", "AND_OP", "CMP_OP", "ADD_OP", "MUL_OP"}
_STMT_START = {"CONST", "TUNE", "LET", "REQUIRE", "GRID", "THREADS", "SHARED", "LOCAL", "FOR", "PARALLEL", "IF", "NAME"}


# The words that start a statement: keywords, and the names of the call statements.
_STATEMENT_WORDS = ("const", "tune", "let", "require", "grid", "threads", "shared", "local", "for", "parallel", "if",
                    "copy", "fill", "gemm", "reduce")
_KEYWORDS = {"kernel", "const", "tune", "where", "in", "let", "require", "grid", "threads", "shared", "local", "for",
             "parallel", "if", "else"}
_TOKEN = re.compile(r"//[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9][0-9A-Za-z_.]*|\S")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_DTYPES = r"(?:f16|bf16|f32|f64|i8|u8|i16|u16|i32|u32|i64|u64|f8e4m3|f8e5m2)\b"


@functools.lru_cache(maxsize=1)
def parser() -> lark.Lark:
    grammar = (resource("grammar") / "tilec.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True,
                     start=["start", "expr"])     # expr: tilec.compile's where= condition


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    for t in parser().terminals:
        if t.name == name and t.pattern.type == "str":
            return f"'{t.pattern.value}'"
    return name.lower()


def _describe_expected(expected) -> str:
    names = set(expected)
    words = []
    if _STMT_START <= names:
        words.append("a statement")
        names -= _STMT_START
    if _EXPR_START <= names:
        words.append("an expression")
        names -= _EXPR_START | {"ADD_OP", "NEG_OP"}
    if "$END" in names:
        names.discard("$END")
        words.append("end of input")
    operators = _OPERATORS <= names
    names -= _OPERATORS if operators else set()
    words += sorted(_describe_terminal(n) for n in names)
    if operators:
        words.append("an operator")
    if len(words) == 1:
        return words[0]
    if len(words) == 2:
        return f"{words[0]} or {words[1]}"
    return "one of " + ", ".join(words)


def _describe_token(tok) -> str:
    if tok.type == "$END":
        return "end of input"
    return f"'{tok}'"


def _span_at(source: Source, offset: int, length: int) -> Span:
    line = source.text.count("\n", 0, offset) + 1
    col = offset - (source.text.rfind("\n", 0, offset) + 1) + 1
    return Span(source, line, col, line, col + length)


def _statement_error(source: Source, offset: int) -> ParseError | None:
    """A syntax error at `offset` inside a statement that starts with a name
    that no statement starts with: `thread 128;` (did you mean threads?), or
    `n = 3;` (only tile elements are assigned). None for any other error."""
    text = source.text
    toks = [(m.group(), m.start()) for m in _TOKEN.finditer(text, 0, offset) if not m.group().startswith("//")]
    starts = [j for j, (t, _) in enumerate(toks) if t in ";{}"]
    if not starts or starts[-1] + 1 >= len(toks):
        return None
    stmt = toks[starts[-1] + 1:]
    first, at = stmt[0]
    if not _NAME.match(first) or first in _KEYWORDS or re.match(_DTYPES, first):
        return None
    nxt = stmt[1][0] if len(stmt) > 1 else text[offset:offset + 1]
    span = _span_at(source, at, len(first))
    if len(stmt) == 1 and nxt == "=" and text[offset:offset + 2] != "==":
        return ParseError(_assign_message(text, first), span)
    if nxt == "[" or first in _STATEMENT_WORDS:
        return None             # an element assignment or a call statement: the parser's message says it
    close = difflib.get_close_matches(first.lower(), _STATEMENT_WORDS, n=1, cutoff=0.75)
    if close:
        return ParseError(f"unknown statement '{first}' (did you mean '{close[0]}'?)", span)
    return None


def _assign_message(text: str, name: str) -> str:
    """`name = value;`: what `name` is, as far as the text says, and why it is not assigned."""
    n = re.escape(name)
    header = re.search(r"\bkernel\s+\w+\s*\((.*?)\)\s*\{", text, re.S)
    param = re.search(rf"(?:^|,)\s*{n}\s*:\s*{_DTYPES}\s*(\[)?", header.group(1)) if header else None
    if param and param.group(1) is None:
        return f"'{name}' is a scalar parameter; scalars cannot be assigned (a scalar is a value passed by the call)"
    if param:
        return f"'{name}' is a global tensor; it is not assigned: write a tile and copy it into a region of the tensor"
    if re.search(rf"\b(?:shared|local)\s+{n}\s*:", text):
        return f"'{name}' is a tile; assign its elements inside a parallel body ({name}[i] = ...), or all of them " \
            f"with fill({name}, v)"
    if re.search(rf"\bconst\b[^;]*\b{n}\s*=", text):
        return f"'{name}' is a const; consts cannot be assigned (override one when compiling: -D {name}=...)"
    if re.search(rf"\blet\s+{n}\s*=", text):
        return f"'{name}' is a let; lets cannot be assigned"
    return f"'{name}' cannot be assigned: the only assignment is to a tile element, inside a parallel body " \
        "(s[i] = ...)"


def parse_tree(source: Source, start: str = "start") -> lark.Tree:
    try:
        return parser().parse(source.text, start=start)
    except lark.exceptions.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            lines = source.text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
            end = col + 1
        else:
            line, col = tok.line, tok.column
            end = col + max(1, len(str(tok)))
        better = _statement_error(source, len(source.text) if tok.type == "$END" else tok.start_pos)
        if better is not None:
            raise better from None
        # `accepts` is the exact set the parser could take here (`expected` also
        # holds lookaheads of merged LALR states that cannot follow).
        msg = f"unexpected {_describe_token(tok)}; expected {_describe_expected(e.accepts or e.expected)}"
        raise ParseError(msg, Span(source, line, col, line, end)) from None
    except lark.exceptions.UnexpectedCharacters as e:
        ch = source.text[e.pos_in_stream]
        shown = f"'{ch}'" if ch.isprintable() and not ch.isspace() else f"U+{ord(ch):04X}"     # (a NUL, a BOM)
        raise ParseError(f"unexpected character {shown}",
                         Span(source, e.line, e.column, e.line, e.column + 1)) from None
    except lark.exceptions.UnexpectedEOF as e:  # pragma: no cover - LALR reports UnexpectedToken
        raise ParseError(f"unexpected end of input; expected {_describe_expected(e.expected)}") from None
