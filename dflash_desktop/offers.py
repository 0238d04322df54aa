"""What a loaded model offers the window, as its `loaded` event says (docs/PROTOCOL.md, `offers`): the window
asks these instead of branching on which engine or server runs the model."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Offers:
    local: bool = True          # runs on this computer: its CPU time is this computer's, its name the catalog's
    baseline: bool = True       # plain decoding can be measured on request (calibration, the speedup demo)
    unload: bool = True         # unload frees its memory while the engine process keeps running
    count_tokens: bool = True   # the engine counts a prompt exactly as generate would

    @classmethod
    def of(cls, loaded: dict | None) -> "Offers":
        """From a loaded event or pair info; nothing loaded offers nothing."""
        if not loaded:
            return cls(False, False, False, False)
        given = loaded.get("offers") if isinstance(loaded.get("offers"), dict) else {}
        return cls(**{f.name: bool(given.get(f.name, f.default)) for f in fields(cls)})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


REMOTE = Offers(local=False, baseline=False, unload=False, count_tokens=False)
