"""Text -> lark parse tree, with lark's exceptions turned into located ParseErrors."""
from __future__ import annotations

import functools

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
        # `accepts` is the exact set the parser could take here (`expected` also
        # holds lookaheads of merged LALR states that cannot follow).
        msg = f"unexpected {_describe_token(tok)}; expected {_describe_expected(e.accepts or e.expected)}"
        raise ParseError(msg, Span(source, line, col, line, end)) from None
    except lark.exceptions.UnexpectedCharacters as e:
        ch = source.text[e.pos_in_stream]
        raise ParseError(f"unexpected character '{ch}'",
                         Span(source, e.line, e.column, e.line, e.column + 1)) from None
    except lark.exceptions.UnexpectedEOF as e:  # pragma: no cover - LALR reports UnexpectedToken
        raise ParseError(f"unexpected end of input; expected {_describe_expected(e.expected)}") from None
