"""Round plugins: the named placements where subsystems join the round.

DESIGN.md: "DP noise is a transform at a named placement (client-side, inside the protocol, or
after aggregation); canaries are extra participants plus an observer". A plugin overrides the
hooks it needs; each has a no-op default::

    honest local work ─► transform_honest        (client side: clipping, local noise)
    + Byzantine messages + extra_messages        (extra participants: canaries)
    ─► transform_messages                         (server side, only if it sees messages)
    ─► protocol.aggregate ─► transform_aggregate (server side: central noise, rescaling)
    ─► decode ─► server step ─► on_round_end     (observers: accountants, trackers)

Plugin state that must survive a restart goes through ``state_dict``/``load_state_dict`` and is
saved in the checkpoint under the plugin's ``name``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from fedsafe.core.types import Aggregate, Message, RoundContext

if TYPE_CHECKING:
    from fedsafe.engine.federation import Federation


class Plugin:
    name = "plugin"

    def message_dim(self, dim: int) -> int:
        """The message dimension after this plugin's client-side transform."""
        return dim

    def transform_honest(self, updates: Tensor, ctx: RoundContext, ids: np.ndarray) -> Tensor:
        return updates

    def extra_messages(self, ctx: RoundContext, dim: int) -> list[Message]:
        return []

    def transform_messages(self, messages: list[Message], ctx: RoundContext) -> list[Message]:
        """Server side, before aggregation; called only when the protocol reveals messages."""
        return messages

    def transform_aggregate(self, vector: Tensor, ctx: RoundContext, agg: Aggregate | None) -> Tensor:
        return vector

    def empty_aggregate(self, ctx: RoundContext, dim: int) -> Tensor | None:
        """What the server releases when nobody was sampled (None: skip the round)."""
        return None

    def on_round_end(self, fed: Federation, row: dict[str, Any]) -> dict[str, Any]:
        return {}

    def summary(self, fed: Federation) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
