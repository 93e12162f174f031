"""The accountant registry: composition engines by name (``"pld"``, ``"rdp"``), one interface.

An :class:`AccountingEngine` composes round events (``accounting.events``) for one
``Accountant``: it says whether it can account an event (:meth:`~AccountingEngine.check`,
:class:`UnsupportedAccountingError` otherwise), takes each composed event
(:meth:`~AccountingEngine.compose`), gives ε at a δ (:meth:`~AccountingEngine.epsilon_details`)
and keeps its own part of a checkpoint (:meth:`~AccountingEngine.state_dict`). The
``Accountant`` facade keeps what every engine needs — the grouped rounds — and looks its engine
up here by name, so a new accountant is added by registering a subclass::

    @ACCOUNTANT_ENGINES.register("mine")
    class MyEngine(AccountingEngine): ...

and how an engine accounts a new event type is registered on the engine's dispatch function
(``accounting.rdp.round_rdp``, ``accounting.pld.round_pld``), not written as a branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import dp_accounting as dpa

from fedsafe.core.registry import Registry

from .common import NEIGHBORING, EpsilonDetails
from .events import RoundRecord

# name -> AccountingEngine subclass (the built-ins: "pld", the default, and "rdp").
ACCOUNTANT_ENGINES: Registry[Any] = Registry("accountant")


def _check_accountant(accountant: str) -> str:
    names = ACCOUNTANT_ENGINES.names()
    if accountant not in names:
        raise ValueError(f"unknown accountant {accountant!r}; valid: {', '.join(names)}")
    return accountant


def engine_class(accountant: str) -> type[AccountingEngine]:
    """The engine registered under ``accountant`` (ValueError naming the valid ones otherwise)."""
    return ACCOUNTANT_ENGINES.entry(_check_accountant(accountant)).impl


class AccountingEngine:
    """One way of composing round events into ε. ``records`` is the ``Accountant``'s grouped
    rounds (event -> count), shared and kept up to date by it: an engine that recomputes ε from
    the whole history reads it, an incremental one keeps its own running state from
    :meth:`compose`. ``records`` never holds an event with z = 0 when ε is asked (ε = ∞ then,
    decided by the facade) and is never empty."""

    name: ClassVar[str] = ""
    #: Whether a run plans the engine's discretization once, from the whole run
    #: (:func:`~fedsafe.privacy.dp.accounting.accountant.planned_interval`), and composes rounds
    #: into running state at it (PLD); otherwise every ε is computed afresh (RDP).
    plans_interval: ClassVar[bool] = False
    #: Whether ε is cheap enough to report after every round (RDP: a sum over orders); an
    #: engine without it reports ε at evaluation rounds and at the end only.
    epsilon_every_round: ClassVar[bool] = False

    def __init__(
        self,
        neighboring: str,
        records: dict[RoundRecord, int],
        *,
        interval: float | None,
        orders: Sequence[float],
    ) -> None:
        self.neighboring = neighboring
        self.records = records
        self.interval = interval
        self.orders = tuple(orders)

    @property
    def relation(self) -> dpa.NeighboringRelation:
        return NEIGHBORING[self.neighboring]

    @property
    def incremental(self) -> bool:
        """Whether ε comes from running state composed round by round (see ``Accountant``)."""
        return False

    @property
    def chooses_interval(self) -> bool:
        """Whether ε is computed at a discretization the engine chooses per call (calibration then
        checks its result at that choice: ``calibrate_noise``)."""
        return False

    # -- what an engine must provide

    def check(self, event: RoundRecord) -> None:
        """Raise :class:`UnsupportedAccountingError` if this engine cannot account ``event``."""
        raise NotImplementedError

    def compose(self, event: RoundRecord, count: int) -> None:
        """``count`` rounds of ``event`` were added to :attr:`records` (already checked)."""

    def epsilon_details(self, delta: float) -> EpsilonDetails:
        """ε at ``delta`` of :attr:`records`."""
        raise NotImplementedError

    def fresh(self, interval: float | None = None) -> dpa.PrivacyAccountant:
        """An empty dp-accounting accountant with this engine's settings (for calibration)."""
        raise NotImplementedError

    def accounting_event(self, event: dpa.DpEvent) -> dpa.DpEvent:
        """``event`` (canonical convention z = s/C) as :meth:`fresh`'s accountant must receive it."""
        return event

    @staticmethod
    def gaussian_epsilon(mu: float, delta: float, orders: Sequence[float]) -> float:
        """ε at ``delta`` of one Gaussian mechanism of sensitivity ``mu`` noise stds (0 < μ < ∞)."""
        raise NotImplementedError

    # -- checkpoints (the facade writes the records; an engine adds its own keys)

    def reset(self) -> None:
        """Forget the running state (the records were replaced)."""

    def state_dict(self, index: dict[RoundRecord, int]) -> dict[str, Any]:
        """This engine's keys of the ``Accountant`` state (``index``: event -> its position in
        the state's ``records``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], parsed: list[tuple[RoundRecord, int]]) -> None:
        """Restore this engine's keys; :attr:`records` already holds ``parsed``."""

