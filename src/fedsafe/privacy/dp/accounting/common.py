"""What every part of the accounting package shares: the vocabulary (samplings, neighbouring
relations, the RDP orders, the PLD discretization settings), the input checks that name the
field and its valid range, the errors, and :class:`EpsilonDetails` (how an ε was obtained).
See the package docstring (``fedsafe.privacy.dp.accounting``) for what the settings mean."""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from fedsafe.core.errors import FedsafeError

NR = dpa.NeighboringRelation

SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "none")
NEIGHBORING: dict[str, dpa.NeighboringRelation] = {
    "add_or_remove_one": NR.ADD_OR_REMOVE_ONE,
    "replace_one": NR.REPLACE_ONE,
}
# fedsafe's clients.sampling -> the accounting sampling scheme. The accountant's "none" (no
# amplification) is what the config, the command line and the docs call "all" (every client
# every round). The internal name stays "none": it is in the records checkpoints keep and in the
# functions' sampling= argument; the word is mapped here and where results are shown
# (:data:`SHOWN_SAMPLING`), not renamed inside.
CLIENT_SAMPLING: dict[str, str] = {"poisson": "poisson", "fixed": "fixed", "all": "none"}
SHOWN_SAMPLING: dict[str, str] = {v: k for k, v in CLIENT_SAMPLING.items()}

RDP_ORDERS: tuple[float, ...] = (
    (1.1, 1.2, 1.3, 1.4)  # coarse: only large-ε regimes need them, and dp-accounting's series for
    # fractional orders this close to 1 converge slowly (or not, with a logged warning) at small z
    + tuple(round(1.5 + k / 20, 2) for k in range(0, 31))  # 1.5 .. 3.0
    + tuple(round(3 + k / 10, 1) for k in range(1, 81))  # 3.1 .. 11.0
    + tuple(float(a) for a in range(12, 65))
    + (72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)
)
# Orders for the quick RDP estimate that picks PLD's first interval: integers only, whose RDP
# dp-accounting computes in closed form (the fractional orders' series cost ~8x as much).
RDP_ESTIMATE_ORDERS: tuple[float, ...] = tuple(a for a in RDP_ORDERS if a >= 2 and a == int(a))
# PLD discretization (see the module docstring): the coarsest interval on the ladder, the scale of
# the first one tried (h0 = scale * eps_RDP / sqrt(T)), the agreement that stops the refinement,
# how many halvings at most, the RDP bound above which PLD is not run, and the most points a
# one-round PLD may have (2^23 float64: 64 MiB per array).
PLD_MAX_INTERVAL: float = 1e-2
PLD_INTERVAL_SCALE: float = 0.05
PLD_REFINE_TOL: float = 0.005
PLD_PLANNED_TOL: float = 0.0005  # a run's interval: the coarser of two that agree this closely
PLD_MAX_REFINEMENTS: int = 12
PLD_EPSILON_LIMIT: float = 1e4
PLD_MAX_POINTS: int = 2**23
# Per-round multipliers that vary are rounded down to 2^(k / Z_GRID_PER_OCTAVE) (grid_floor).
Z_GRID_PER_OCTAVE: int = 256
CALIBRATION_TOL: float = 1e-4
# Calibration refuses targets met with less noise than this: ε there is in the hundreds and PLD
# slows down sharply (its support grows like 1/z).
_Z_FLOOR = 0.125
_Z_CEIL = 2.0**30


# --------------------------------------------------------------------------- validation


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return d


def _check_z(z: float) -> float:
    if isinstance(z, bool):
        raise ValueError(f"z (noise multiplier) must be a finite number >= 0, got {z!r}")
    v = float(z)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"z (noise multiplier) must be a finite number >= 0 (0 gives epsilon = inf), got {z!r}")
    return v


def _check_q(q: float | None, *, required: bool, sampling: str) -> float | None:
    if q is None:
        if required:
            raise ValueError(f"q (sampling probability) is required for sampling={sampling!r}")
        return None
    v = float(q)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"q (sampling probability) must be in (0, 1], got {q!r}")
    return v


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_interval(interval: float | None) -> float | None:
    if interval is None:
        return None
    v = float(interval)
    if not (math.isfinite(v) and 0 < v <= PLD_MAX_INTERVAL):
        raise ValueError(
            f"value_discretization_interval must be in (0, {PLD_MAX_INTERVAL:g}] (coarser intervals make "
            f"dp-accounting's PLD numerically unreliable), or None to choose it; got {interval!r}"
        )
    return v



def _check_sampling(sampling: str) -> str:
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; valid: {', '.join(SAMPLINGS)}")
    return sampling


def _check_neighboring(neighboring: str) -> str:
    if neighboring not in NEIGHBORING:
        extra = (
            " (replace_special is not offered: for Gaussian sums it equals add_or_remove_one)"
            if neighboring == "replace_special"
            else ""
        )
        raise ValueError(
            f"unknown neighboring relation {neighboring!r}; valid: {', '.join(NEIGHBORING)}{extra}"
        )
    return neighboring


def natural_neighboring(sampling: str) -> str:
    """The relation fedsafe uses by default for a sampling scheme: ``replace_one`` for
    ``fixed`` (the only one dp-accounting accounts it under), ``add_or_remove_one`` otherwise."""
    return "replace_one" if _check_sampling(sampling) == "fixed" else "add_or_remove_one"


# --------------------------------------------------------------------------- round records



# dp-accounting's tail truncation for PLD compose / self_compose.
PLD_TAIL_MASS_TRUNCATION: float = 1e-15


class UnsupportedAccountingError(FedsafeError, ValueError):
    """A (sampling, accountant, neighbouring relation) combination dp-accounting cannot account,
    or a round event no registered accountant engine accounts."""


class PLDTooLargeError(FedsafeError, ValueError):
    """A PLD would exceed :data:`PLD_MAX_POINTS` points at the requested interval."""


def _unsupported_message(accountant: str, neighboring: str, sampling: str) -> str:
    rel = NEIGHBORING[neighboring].name
    head = f"the {accountant.upper()} accountant cannot account sampling={sampling!r} under {rel} ({neighboring})"
    if sampling == "fixed" and accountant == "pld":
        why = (
            "dp-accounting's PLD accountant does not support SampledWithoutReplacementDpEvent under "
            "any neighbouring relation; use accountant='rdp' with neighboring='replace_one'"
        )
    elif sampling == "fixed":
        why = (
            "dp-accounting accounts SampledWithoutReplacementDpEvent only under REPLACE_ONE; "
            "use neighboring='replace_one' (or Poisson sampling for add/remove)"
        )
    elif sampling == "poisson" and accountant == "rdp":
        why = (
            "dp-accounting's RDP accountant supports PoissonSampledDpEvent only under "
            "ADD_OR_REMOVE_ONE; use neighboring='add_or_remove_one', or accountant='pld'"
        )
    else:
        why = "dp-accounting does not support this event"
    return f"{head}: {why}"


@dataclass(frozen=True)
class EpsilonDetails:
    """How an ε was obtained: ``method`` is ``"rdp"``, ``"pld"``, or ``"rdp-bound"`` (PLD not run:
    the RDP bound exceeded :data:`PLD_EPSILON_LIMIT`), ``interval`` the PLD discretization of the
    reported value, ``intervals`` every (interval, ε) computed, ``note`` a sentence for users."""

    epsilon: float
    method: str
    interval: float | None = None
    intervals: tuple[tuple[float, float], ...] = ()
    note: str = ""


