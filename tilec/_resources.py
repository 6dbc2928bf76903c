"""Where the packaged grammar and templates live: beside the package in a
checkout (`grammar/`, `templates/` at the top level), or installed into the
wheel as `tilec/grammar` and `tilec/templates`."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    here = _CHECKOUT / name
    if here.is_dir():
        return here
    return Path(str(importlib.resources.files(f"tilec.{name}")))
