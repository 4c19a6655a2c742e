"""The settings of a run that come from the environment, read once (`Options.from_env`, where a run
starts) and passed down as one frozen value; no module reads the environment at import time."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

ENV_VERIFY_TIMEOUT = "EQUIVCI_VERIFY_TIMEOUT"
ENV_VERIFY_MEMORY = "EQUIVCI_VERIFY_MEMORY"
ENV_CACHE_DIR = "EQUIVCI_CACHE_DIR"
ENV_SATURATION_ITERATIONS = "EQUIVCI_SATURATION_ITERATIONS"
SATURATION_ITERATIONS = 120


def _three_quarters_of_memory() -> int:
    # Leave a quarter of the machine to everything else (the numeric oracle child, the CI runner).
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.75)


@dataclasses.dataclass(frozen=True)
class Options:
    verify_timeout_seconds: float = 900.0  # EQUIVCI_VERIFY_TIMEOUT: the proof search of one model
    verify_memory_bytes: int = dataclasses.field(default_factory=_three_quarters_of_memory)  # EQUIVCI_VERIFY_MEMORY
    cache_dir: Path | None = None  # EQUIVCI_CACHE_DIR (--cache-dir wins over it)
    # EQUIVCI_SATURATION_ITERATIONS: the least saturation budget (a deeper program gets its depth)
    saturation_iterations: int = SATURATION_ITERATIONS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Options:
        memory = int(environ.get(ENV_VERIFY_MEMORY, 0))
        cache_dir = environ.get(ENV_CACHE_DIR)
        return cls(
            verify_timeout_seconds=float(environ.get(ENV_VERIFY_TIMEOUT, 900)),
            verify_memory_bytes=memory or _three_quarters_of_memory(),
            cache_dir=Path(cache_dir).resolve() if cache_dir else None,
            saturation_iterations=int(environ.get(ENV_SATURATION_ITERATIONS, SATURATION_ITERATIONS)),
        )
