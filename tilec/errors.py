"""Errors users see. Every error that comes from a program carries a span and
renders as ``file:line:col: error: message`` + the source line + a caret."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """The text of one .tile program and the name it is reported under."""
    name: str
    text: str

    def line(self, lineno: int) -> str:
        lines = self.text.splitlines()
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    source: Source
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.col}"


class TilecError(Exception):
    """Base of every error tilec raises on purpose."""

    def __init__(self, message: str, span: Span | None = None, note: str | None = None):
        self.message = message
        self.span = span
        self.note = note
        super().__init__(self.render())

    def render(self) -> str:
        if self.span is None:
            text = f"error: {self.message}"
        else:
            s = self.span
            src_line = s.source.line(s.line)
            width = max(1, (s.end_col - s.col) if s.end_line == s.line else len(src_line) - s.col + 1)
            # keep the line's tabs so the caret sits under the token in a terminal
            lead = "".join(c if c == "\t" else " " for c in src_line[:s.col - 1])
            caret = lead + "^" + "~" * (width - 1)
            text = f"{s}: error: {self.message}\n{src_line}\n{caret}"
        if self.note:
            text += f"\nnote: {self.note}"
        return text


class ParseError(TilecError):
    """The text is not a tilec program."""


class SemanticError(TilecError):
    """The program parses but breaks a rule of the language or of the target."""


class UnsupportedError(SemanticError):
    """A construct of the language that this version of tilec does not lower yet."""


class LaunchError(TilecError):
    """A call's arguments break a rule (shape, dtype, device, TMA legality)."""


class CaptureError(LaunchError):
    """A call during CUDA graph capture that is not the replay of an earlier call."""


class CompileError(TilecError):
    """NVRTC rejected the generated CUDA: a tilec bug, reported with both lines."""


class DeviceError(TilecError):
    """The CUDA driver reported an error while loading or running a kernel."""


class TmaFallbackWarning(UserWarning):
    """A launch ran a kernel's thread-copy variant because an argument breaks a TMA rule."""


class TuneMismatchWarning(UserWarning):
    """An autotune candidate's outputs differed from the reference candidate's (the
    first that ran, the declared consts where they run): it was not chosen."""


class TuneLaunchWarning(UserWarning):
    """An autotune candidate the compiler accepted failed to launch (the CUDA driver
    refused it, a DeviceError): it was not timed or chosen. A bug in tilec."""


class ToolchainWarning(UserWarning):
    """The NVRTC in use is known to miscompile something this kernel holds (runtime/nvrtc.py:
    known_miscompiles): its results may be wrong; the message says which NVRTC fixes it."""


class CheckIncompleteWarning(UserWarning):
    """check-barriers explored only its first MAX_PATHS paths of a kernel: the rest went unchecked."""


class PipelineWarning(UserWarning):
    """A `pipelined` loop of 2 or more stages runs as a plain loop (no load runs ahead of
    the body); the message points at the loop and says why."""


def os_reason(e: OSError) -> str:
    """An OSError's reason as the middle of a sentence: "is a directory", "no space
    left on device" (strerror, lowercased; the exception's text without one)."""
    reason = e.strerror or str(e)
    return reason[:1].lower() + reason[1:]


def recursion_checked(fn):
    """`fn`, with Python's RecursionError (a program nested past what tilec's
    recursive passes take, which the parser's nesting limit should have caught)
    as a TilecError instead of a traceback."""
    import functools

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RecursionError:
            raise TilecError("the program nests too deeply for tilec (Python's recursion limit), lets substituted "
                             "where they are used: split long expressions over several statements") from None
    return checked

