"""Client algorithms: what an honest client computes in a round, and their registry.

The engine's ``ClientWork`` (``fedsafe.engine.clients``) holds what every algorithm shares —
the config's ``[clients]`` section, the execution backend (per-client minibatch gradients),
the federated data and seeded minibatches (``work.batch(round, step, ids, poison)``),
each client's local step count (``work.steps``) and the ``[zo]`` section (``work.zo``) — and hands the algorithm-specific parts to the
:class:`ClientAlgorithm` registered for the configuration:

``run``               the honest clients' messages (``LocalResult``: updates, losses, momentum)
``message_dim``       the message length for a ``dim``-parameter model
``decode``            the aggregate -> a parameter-space descent direction for the server
``server_optimizer``  the server step the direction goes to (wraps the configured one or not)
``keeps_momentum``    whether the engine keeps a momentum row per client between rounds
``setup``             once, with the client work: the algorithm's own settings (BAFFLE's, from ``[zo]``)
``shared_state`` / ``load_shared_state``
                      what a copy of the algorithm in another process (a Ray task) needs from
                      the driver's: state a plugin gave it (the inherent row's σ²)
``remote_settings`` / ``load_remote_settings``
                      the numbers of that state a remote client (a Flower node) receives each round

The algorithm owns its settings and state; the client work only holds what all of them share.

:data:`CLIENT_ALGORITHMS` is keyed by :func:`algorithm_key`: ``clients.algorithm`` for
backpropagation clients, with ``:zeroth_order`` appended for BAFFLE's forward-only ones. The
built-in algorithms are registered lazily here; a new one registers its class (a subclass of
:class:`ClientAlgorithm`, built with no arguments) with ``CLIENT_ALGORITHMS.register("name")``
and the engine needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsafe.core.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

ZEROTH_ORDER = "zeroth_order"


@dataclass
class LocalResult:
    updates: Tensor  # (n, d), in the message space of the algorithm
    losses: Tensor  # (n,), each client's minibatch loss at the global model
    momentum: Tensor | None  # (n, d) new dsgd momentum rows, else None
    survivors: np.ndarray | None = None  # (n,) bool; False = the client dropped out (None: all ok)
    # remote clients (fedsafe.flower): each client's plugin reports (Plugin.client_reports), in row order
    reports: list[dict[str, float]] | None = None


class ClientAlgorithm:
    """Defaults for the hooks an algorithm may leave alone: messages in parameter space, which
    are already descent directions, and the configured server step."""

    keeps_momentum = False

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        raise NotImplementedError

    def message_dim(self, work: Any, dim: int) -> int:
        return dim

    def decode(self, work: Any, aggregate: Tensor, round_: int) -> Tensor:
        return aggregate

    def server_optimizer(self, work: Any, inner: Any) -> Any:
        return inner

    def setup(self, work: Any) -> None:
        """Called once by the client work that runs this algorithm, before any round; raises
        ``ValueError`` for settings it cannot run with."""
        return None

    def shared_state(self) -> Any:
        """What a copy of this algorithm in another process needs from this one (picklable)."""
        return None

    def load_shared_state(self, state: Any) -> None:
        return None

    def remote_settings(self) -> dict[str, float]:
        """What a remote client (a Flower node) receives each round, as numbers."""
        return {}

    def load_remote_settings(self, settings: Any, *, experiment: Any, source: Any) -> None:
        """On a remote client: :meth:`remote_settings` as received (``settings``: a mapping that
        may hold other keys), with the node's ``experiment`` config and noise ``source``."""
        return None


def algorithm_key(algorithm: str, gradient: str = "backprop") -> str:
    """The :data:`CLIENT_ALGORITHMS` key of ``clients.algorithm`` with ``clients.gradient``."""
    return algorithm if gradient != ZEROTH_ORDER else f"{algorithm}:{ZEROTH_ORDER}"


CLIENT_ALGORITHMS: Registry = Registry("client algorithm")
CLIENT_ALGORITHMS.register_lazy(
    "dsgd", "fedsafe.engine.algorithms:DSGD", "one minibatch gradient at the global model; sends local momentum"
)
CLIENT_ALGORITHMS.register_lazy(
    "fedavg", "fedsafe.engine.algorithms:FedAvg", "local SGD steps; sends the model delta"
)
CLIENT_ALGORITHMS.register_lazy(
    "inherent", "fedsafe.privacy.inherent.clients:InherentClients", "FedSGD releasing a Table 1 row (Zhang et al.)"
)
CLIENT_ALGORITHMS.register_lazy(
    "dsgd:zeroth_order", "fedsafe.zo.algorithms:ZOFedSGD", "BAFFLE FedSGD: K loss differences at shared perturbations"
)
CLIENT_ALGORITHMS.register_lazy(
    "fedavg:zeroth_order", "fedsafe.zo.algorithms:ZOFedAvg", "BAFFLE FedAvg: local zeroth-order SGD steps"
)
