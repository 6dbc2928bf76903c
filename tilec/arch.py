"""The NVIDIA architectures tilec compiles for, and what each one gets.

    sm_80, sm_86, sm_89   no TMA, no mbarrier transaction counts, no wgmma: every
                          global <-> shared copy is a bounds-checked thread copy
                          (the thread-copy variant's lowering); `gemm` is refused
    sm_90a                TMA tiled and im2col copies, the mbarrier protocol, wgmma
    sm_100a, sm_120a      TMA and the mbarrier protocol as on sm_90a (the same PTX);
                          no wgmma (it is sm_90a only), so `gemm` is refused

Passes read the target from `Options.arch` and ask this module; no pass imports
another."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TilecError


@dataclass(frozen=True)
class Arch:
    name: str
    family: str             # for messages
    major: int
    minor: int
    specific: bool          # an `a` target: its cubin runs on exactly this compute capability
    tma: bool               # cp.async.bulk.tensor and mbarrier expect-tx (sm_90 and newer)
    wgmma: bool             # wgmma.mma_async (sm_90a only)
    fp8_cvt: bool           # cvt to / from e4m3x2 / e5m2x2 (sm_89 and newer)
    smem_per_block: int     # the most dynamic shared memory one block may opt in to, in bytes
    block: str              # "a Hopper block": how messages name one block of this target


ARCHS = {a.name: a for a in (
    Arch("sm_80", "Ampere", 8, 0, False, False, False, False, 166912, "an sm_80 (Ampere) block"),
    Arch("sm_86", "Ampere", 8, 6, False, False, False, False, 101376, "an sm_86 (Ampere) block"),
    Arch("sm_89", "Ada", 8, 9, False, False, False, True, 101376, "an sm_89 (Ada) block"),
    Arch("sm_90a", "Hopper", 9, 0, True, True, True, True, 232448, "a Hopper block"),
    Arch("sm_100a", "Blackwell", 10, 0, True, True, False, True, 232448, "an sm_100a (Blackwell) block"),
    Arch("sm_120a", "Blackwell", 12, 0, True, True, False, True, 101376, "an sm_120a (Blackwell) block"),
)}

NAMES = tuple(ARCHS)
DEFAULT = "sm_90a"


def get(name: str) -> Arch:
    """The architecture called `name`, or a TilecError that lists the ones tilec knows."""
    a = ARCHS.get(name) if isinstance(name, str) else None
    if a is None:
        raise TilecError(f"unknown architecture {name!r}: tilec compiles for {', '.join(NAMES)}")
    return a


def runs_on(name: str, major: int, minor: int) -> bool:
    """Whether a cubin built for `name` runs on a device of compute capability
    major.minor: an `a` target on exactly its own; another on the same major
    version with a minor one at least its own."""
    a = get(name)
    if a.specific:
        return (major, minor) == (a.major, a.minor)
    return major == a.major and minor >= a.minor


def for_device(major: int, minor: int) -> str | None:
    """The architecture to compile for on a device of compute capability
    major.minor (the newest one whose cubin runs there), or None."""
    fits = [a.name for a in ARCHS.values() if runs_on(a.name, major, minor)]
    return fits[-1] if fits else None
