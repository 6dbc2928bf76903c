"""tilec: a small compiler from a tile language to CUDA C++ with Hopper TMA."""
from ._version import __version__
from .errors import (CompileError, DeviceError, LaunchError, ParseError, SemanticError, TilecError,
                     TmaFallbackWarning, UnsupportedError)
from .runtime.tensormap import TmaRuleError
from .kernel import Kernel, compile

__all__ = ["__version__", "compile", "Kernel", "TilecError", "ParseError", "SemanticError",
           "UnsupportedError", "LaunchError", "TmaRuleError", "CompileError", "DeviceError", "TmaFallbackWarning"]
