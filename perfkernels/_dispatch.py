"""Runtime ISA dispatch: detect the CPU once, pick a level once, let every family follow it.

Each kernel family (a Cython module) registers a setter with :func:`register`; the setter swaps
that module's pointer to its table of kernels for the level (index into ``ISAS``).  The hot path of a
kernel call then pays one pointer load and one indirect call, nothing else.

Environment variables, read once at import and validated strictly (a bad value fails the import
with the valid choices; it never turns into SIGILL later):

``PERFKERNELS_ISA=<level>``
    Force a level (the levels are the rows of ``_registry.py``).  It must be one this build contains and this CPU can run.
``PERFKERNELS_DISABLE_CPU_FEATURES=avx512f,f16c,...``
    Treat the listed CPU features as absent (as ``NPY_DISABLE_CPU_FEATURES`` does in NumPy).
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable, Iterator

from . import _cpu, _registry

ISAS: tuple[str, ...] = _registry.NAMES
#: the levels of this machine's architecture (the others are never built here): the choices an
#: error names
NATIVE_ISAS: tuple[str, ...] = tuple(lv.name for lv in _registry.LEVELS
                                     if lv.arch in ("any", _registry.host_arch()))

#: CPU features each level needs (os_ymm/os_zmm: the OS saves the wider registers).
REQUIREMENTS: dict[str, tuple[str, ...]] = {lv.name: lv.requires for lv in _registry.LEVELS}

_lock = threading.RLock()
_setters: list[Callable[[int], None]] = []
_detected: dict[str, bool] = _cpu.detect()
_disabled: tuple[str, ...] = ()
_features: dict[str, bool] = dict(_detected)
_active: int = 0
_base: int = 0                             # the level outside every use_isa block
_overrides: list[tuple[object, int]] = []  # the open use_isa blocks, oldest first
_chosen_by: str = "default (best available)"


def _parse_disabled(value: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower() for n in value.replace(" ", ",").split(",") if n.strip())
    unknown = [n for n in names if n not in _detected]
    if unknown:
        raise RuntimeError(
            f"PERFKERNELS_DISABLE_CPU_FEATURES={value!r}: unknown feature(s) {', '.join(unknown)}; "
            f"valid names: {', '.join(_detected)}")
    return names


def cpu_features() -> dict[str, bool]:
    """CPU features as perfkernels sees them (detected, minus ``PERFKERNELS_DISABLE_CPU_FEATURES``).

    Examples
    --------
    >>> import perfkernels
    >>> isinstance(perfkernels.cpu_features(), dict)
    True
    """
    return dict(_features)


def _missing(isa: str) -> list[str]:
    return [f for f in REQUIREMENTS[isa] if not _features.get(f, False)]


def _compiled(isa: str) -> bool:
    return _cpu.isa_compiled(ISAS.index(isa))


def available_isas() -> tuple[str, ...]:
    """ISA levels this build contains and this CPU can run, lowest first.

    Examples
    --------
    >>> import perfkernels
    >>> perfkernels.available_isas()[0]        # the portable level runs everywhere
    'scalar'
    """
    return tuple(isa for isa in ISAS if _compiled(isa) and not _missing(isa))


def active_isa() -> str:
    """The level every kernel call uses now.

    Examples
    --------
    >>> import perfkernels
    >>> perfkernels.active_isa() in perfkernels.available_isas()
    True
    """
    return ISAS[_active]


def _check_runnable(isa: object, source: str) -> int:
    if not isinstance(isa, str) or isa.lower() not in ISAS:
        raise ValueError(f"{source}={isa!r} is not an ISA level; valid choices: {', '.join(NATIVE_ISAS)} "
                         f"(this machine can run: {', '.join(available_isas())})")
    isa = isa.lower()
    if not _compiled(isa):
        raise RuntimeError(f"{source}={isa!r}: this build of perfkernels does not contain {isa} kernels "
                           f"(a level of another architecture, or a build that left it out with "
                           f"PERFKERNELS_LEVELS); "
                           f"valid choices here: {', '.join(available_isas())}")
    missing = _missing(isa)
    if missing:
        raise RuntimeError(f"{source}={isa!r} cannot run on this CPU: missing {', '.join(missing)}; "
                           f"valid choices here: {', '.join(available_isas())}")
    return ISAS.index(isa)


def _apply(level: int) -> None:
    global _active
    with _lock:
        for setter in _setters:
            setter(level)
        _active = level


def register(setter: Callable[[int], None]) -> None:
    """Called once by each family module at import: ``setter(level)`` selects its kernel table."""
    with _lock:
        _setters.append(setter)
        setter(_active)


@contextlib.contextmanager
def use_isa(isa: str) -> Iterator[str]:
    """Run the body with every kernel forced to ``isa`` (``"scalar"``, ``"avx2"``, ``"neon"``, ...).

    Meant for tests and benchmarks.  The setting is process-wide, not per thread (every kernel
    call of every thread uses the one active level).  Blocks may nest and may overlap in several
    threads: the level is that of the most recently entered block still open, and when the last
    open block exits, whatever the order, the level from before the first one is back.  Raises
    ``ValueError`` for an unknown name and ``RuntimeError`` for a level this CPU or build cannot run.

    >>> import perfkernels
    >>> with perfkernels.use_isa("scalar"):
    ...     perfkernels.active_isa()
    'scalar'
    """
    level = _check_runnable(isa, "use_isa(isa)")
    token = object()
    with _lock:
        _overrides.append((token, level))
        _apply(level)
    try:
        yield ISAS[level]
    finally:
        with _lock:
            _overrides[:] = [entry for entry in _overrides if entry[0] is not token]
            _apply(_overrides[-1][1] if _overrides else _base)


def _init_from_environment() -> None:
    global _disabled, _features, _chosen_by, _base
    _disabled = _parse_disabled(os.environ.get("PERFKERNELS_DISABLE_CPU_FEATURES", ""))
    _features = {name: (ok and name not in _disabled) for name, ok in _detected.items()}
    forced = os.environ.get("PERFKERNELS_ISA", "").strip()
    if forced:
        level = _check_runnable(forced, "PERFKERNELS_ISA")
        _chosen_by = "PERFKERNELS_ISA"
    else:
        level = ISAS.index(available_isas()[-1])
    _base = level
    _apply(level)


def _far_env() -> bool:
    import os
    return os.environ.get("PERFKERNELS_FAR_PREFETCH") in ("l1", "l2")


def show_runtime() -> None:
    """Print the build, the detected CPU features and the chosen ISA level.

    Examples
    --------
    >>> import perfkernels
    >>> perfkernels.show_runtime()          # doctest: +SKIP
    perfkernels 0.1.0: ISA level avx512 ...
    """
    import platform
    import sys

    import numpy as np

    from . import __version__

    def flag(name: str) -> str:
        if name in _disabled and _detected[name]:
            return f"{name} (disabled)"
        return name

    have = [flag(n) for n, ok in _detected.items() if ok]
    lacking = [n for n, ok in _detected.items() if not ok]
    compiled = [isa for isa in ISAS if _compiled(isa)]
    lines = [
        f"perfkernels {__version__}",
        f"  python        {sys.version.split()[0]} on {platform.machine()} ({platform.system()})",
        f"  numpy         {np.__version__}",
        f"  compiler      {_cpu.build_compiler()}",
        f"  built ISAs    {', '.join(compiled)}",
        f"  cpu features  {', '.join(have) or '(none detected)'}",
        f"  not present   {', '.join(lacking) or '-'}",
        f"  available     {', '.join(available_isas())}",
        f"  active        {active_isa()}   [{_chosen_by}]",
        f"  far prefetch  rows of tables of 16 MiB and more into {_cpu.far_prefetch().upper()}"
        f"   [{'PERFKERNELS_FAR_PREFETCH' if _far_env() else 'by CPU vendor'}]",
    ]
    for isa in NATIVE_ISAS[1:]:
        missing = _missing(isa)
        if missing:
            lines.append(f"  {isa:<13} unavailable: missing {', '.join(missing)}")
    print("\n".join(lines))
