"""The disk cache of compiled kernels.

An entry holds everything a launch needs (cubin, CUDA and host-wrapper source,
PTX, dynamic smem size), keyed by the .tile text, the consts, the target
architecture, the NVRTC version and the tilec version, so a warm process start
neither lowers nor runs NVRTC. Entries are written to a temporary file and
renamed into place (atomic on POSIX, so concurrent writers are safe); every
entry carries a SHA-256 of its payload and a corrupted or truncated one is
ignored and rebuilt, never loaded. Its layout: MAGIC, the payload's SHA-256,
the lengths of the meta JSON and the cubin, then the payload: the JSON, the
cubin, and the meta's long text and bytes values as raw sections (the JSON
lists their names, kinds and lengths), which load without JSON's string
decoding (a kernel's PTX and CUDA source are ~100 KB: half the time of a warm
start's load went to decoding them).

TILEC_CACHE_DIR overrides the location (default: $XDG_CACHE_HOME/tilec or
~/.cache/tilec); TILEC_CACHE=0 turns the disk cache off. A directory that cannot
be written (TILEC_CACHE_DIR naming a file, no permission) warns once per process
(RuntimeWarning) and compiling goes on without the cache."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

MAGIC = b"TILEC2\0\0"
SECTIONS = "tl_sections"    # the meta JSON's list of [name, "str" | "bytes", length] of the raw sections
RAW_OVER = 256              # str values longer than this go to raw sections; bytes values always do


def enabled() -> bool:
    return os.environ.get("TILEC_CACHE", "1") not in ("0", "", "off", "false")


def directory() -> Path:
    d = os.environ.get("TILEC_CACHE_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilec"


_CODE_IDENTITY = None


def code_identity() -> str:
    """The compiler's own code (sizes and mtimes of its .py files, the text of its
    templates and grammar), so an entry written by a different build of tilec is
    never loaded."""
    global _CODE_IDENTITY
    if _CODE_IDENTITY is None:
        from .._resources import resource
        pkg = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for f in sorted(pkg.rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(pkg)}:{st.st_size}:{st.st_mtime_ns};".encode())
        for name in ("templates", "grammar"):
            for f in sorted(resource(name).iterdir(), key=lambda f: f.name):
                if f.name.endswith((".j2", ".lark")):
                    h.update(f"{name}/{f.name}:".encode() + hashlib.sha256(f.read_bytes()).digest())
        _CODE_IDENTITY = h.hexdigest()
    return _CODE_IDENTITY


def key(*parts) -> str:
    h = hashlib.sha256()
    for p in (code_identity(),) + parts:
        data = p if isinstance(p, bytes) else repr(p).encode()
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def _path(k: str) -> Path:
    return directory() / k[:2] / f"{k}.tilec"


def exists(k: str) -> bool:
    """Whether an entry is stored under `k` (not read: load() may still find it corrupt)."""
    return enabled() and _path(k).is_file()


def load(k: str):
    """The entry (meta dict, cubin bytes), or None when absent, unreadable or corrupt."""
    if not enabled():
        return None
    try:
        blob = _path(k).read_bytes()
    except OSError:
        return None
    try:
        if blob[:8] != MAGIC:
            return None
        digest, meta_len, cubin_len = blob[8:40], *struct.unpack("<QQ", blob[40:56])
        payload = memoryview(blob)[56:]
        if len(payload) < meta_len + cubin_len or hashlib.sha256(payload).digest() != digest:
            return None
        meta = json.loads(bytes(payload[:meta_len]).decode())
        at = meta_len + cubin_len
        for name, kind, n in meta.pop(SECTIONS, ()):
            raw = bytes(payload[at:at + n])
            meta[name] = raw.decode() if kind == "str" else raw
            at += n
        if at != len(payload):
            return None
        return meta, bytes(payload[meta_len:meta_len + cubin_len])
    except (ValueError, struct.error, UnicodeDecodeError, TypeError):
        return None


def store(k: str, meta: dict, cubin: bytes) -> None:
    if not enabled():
        return
    path = _path(k)
    small, raw = {}, []
    for name, value in meta.items():
        if isinstance(value, bytes) or (isinstance(value, str) and len(value) > RAW_OVER):
            data = value if isinstance(value, bytes) else value.encode()
            raw.append(([name, "bytes" if isinstance(value, bytes) else "str", len(data)], data))
        else:
            small[name] = value
    if raw:
        small[SECTIONS] = [head for head, _ in raw]
    meta_b = json.dumps(small, sort_keys=True).encode()
    payload = meta_b + cubin + b"".join(data for _, data in raw)
    blob = MAGIC + hashlib.sha256(payload).digest() + struct.pack("<QQ", len(meta_b), len(cubin)) + payload
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tilec")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        _warn_unwritable(e)     # a cache that cannot be written is only a slower start: said once


_WARNED: set = set()        # the cache directories warned about


def _warn_unwritable(e: OSError) -> None:
    d = directory()
    if str(d) in _WARNED:
        return
    _WARNED.add(str(d))
    import warnings
    from ..errors import os_reason
    what = "TILEC_CACHE_DIR=" if os.environ.get("TILEC_CACHE_DIR") else "the disk cache "
    warnings.warn(f"{what}{d} cannot be written ({os_reason(e)}: {e.filename}): compiled "
                  "kernels are not cached on disk (TILEC_CACHE=0 turns it off without this warning)",
                  RuntimeWarning, stacklevel=3)
