"""tilec: a small compiler from a tile language to CUDA C++ with Hopper TMA."""
from ._version import __version__
from .errors import (CaptureError, CheckIncompleteWarning, CompileError, DeviceError, LaunchError, ParseError,
                     PipelineWarning, SemanticError, TilecError, TmaFallbackWarning, ToolchainWarning,
                     TuneLaunchWarning, TuneMismatchWarning, UnsupportedError)
from .runtime.tensormap import TmaRuleError
from .kernel import Kernel, compile

__all__ = ["__version__", "compile", "Kernel", "TilecError", "ParseError", "SemanticError",
           "UnsupportedError", "LaunchError", "TmaRuleError", "CaptureError", "CompileError", "DeviceError",
           "TmaFallbackWarning", "CheckIncompleteWarning", "PipelineWarning", "TuneMismatchWarning",
           "TuneLaunchWarning", "ToolchainWarning"]


def __getattr__(name):
    if name == "torch":       # tilec.torch (kernels as torch operators) imports torch: only when asked for
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tilec' has no attribute {name!r}")
