"""The old home of the server's root-dataset update (FLTrust): it now belongs to the robust
pipeline of a rule that takes ``server_update`` (:mod:`fedsafe.robust.root`). This module keeps
the old constructor, which builds the engine's :class:`ClientWork` on the root dataset."""

from __future__ import annotations

from typing import Any

from fedsafe.data import FederatedDataset
from fedsafe.engine.clients import ClientWork
from fedsafe.robust.root import RootUpdate as _RobustRootUpdate


class RootUpdate(_RobustRootUpdate):
    """:class:`fedsafe.robust.root.RootUpdate` with the configured client work."""

    def __init__(self, cfg: Any, backend: Any, data: FederatedDataset, seed: int, root_size: int, zo: Any = None) -> None:
        super().__init__(data, seed, root_size, lambda root, root_seed: ClientWork(cfg, backend, root, root_seed, zo=zo))
