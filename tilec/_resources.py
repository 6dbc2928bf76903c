"""tilec's data: grammar/, templates/ and examples/ at the top of a checkout,
packaged as tilec.grammar, tilec.templates and tilec.examples (pyproject.toml's
package-dir). importlib.resources finds them in a wheel or an editable install
alike; read them as Traversables (`/`, `.read_text()`, `.iterdir()`), never
through `str()` of one, which is not a path."""
from __future__ import annotations

import importlib.resources
from pathlib import Path


def resource(name: str):
    """The Traversable of the data directory `name` ("grammar", "templates" or "examples")."""
    try:
        return importlib.resources.files(f"tilec.{name}")
    except ModuleNotFoundError:   # tilec imported from a checkout that is not installed
        return Path(__file__).resolve().parent.parent / name
