"""``python -m bridge.sim``: serve the simulator (see :mod:`bridge.sim.cli` for the options)."""

from __future__ import annotations

from bridge.sim.cli import sim_main

__all__ = ["sim_main"]

if __name__ == "__main__":
    raise SystemExit(sim_main())
