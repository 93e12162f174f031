"""One-shot ε, noise calibration and the ``fedsafe privacy epsilon`` / ``calibrate`` reports,
over the ``Accountant`` facade (any registered engine, by name)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import dp_accounting as dpa
import numpy as np

from .accountant import Accountant
from .common import (
    CALIBRATION_TOL,
    SHOWN_SAMPLING,
    _Z_CEIL,
    _Z_FLOOR,
    EpsilonDetails,
    UnsupportedAccountingError,
    _check_count,
    _check_delta,
    natural_neighboring,
)
from .engines import ACCOUNTANT_ENGINES
from .events import RoundRecord, make_round_record
from .pld import first_interval

# The order ``fedsafe privacy epsilon`` shows the accountants in (then any other registered one).
TABLE_ORDER: tuple[str, ...] = ("rdp", "pld")


def _table_accountants() -> list[str]:
    names = ACCOUNTANT_ENGINES.ordered()
    return [n for n in TABLE_ORDER if n in names] + [n for n in names if n not in TABLE_ORDER]

# --------------------------------------------------------------------------- one-shot functions


def _one_shot(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str,
    accountant: str,
    num_clients: int | None,
    sample_size: int | None,
    neighboring: str | None,
    value_discretization_interval: float | None,
) -> Accountant:
    rounds = _check_count("rounds", rounds, 0)
    acc = Accountant(
        delta,
        accountant,
        neighboring or natural_neighboring(sampling),
        value_discretization_interval=value_discretization_interval,
    )
    return acc.compose_round(z, q, sampling, num_clients=num_clients, sample_size=sample_size, count=rounds)


def epsilon(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
    value_discretization_interval: float | None = None,
) -> float:
    """ε after ``rounds`` identical DP-FedAvg rounds, at ``delta``.

    ``sampling``: ``poisson`` (q), ``fixed`` (N = ``num_clients``, m = ``sample_size`` or
    round(q·N)), ``none`` (q ignored). ``neighboring`` defaults to :func:`natural_neighboring`.
    z = 0 gives ∞, rounds = 0 gives 0. Unsupported combinations raise
    :class:`UnsupportedAccountingError` (see the module table). PLD chooses its discretization
    unless ``value_discretization_interval`` is given (see the module docstring).
    """
    return _one_shot(
        z, q, rounds, delta, sampling, accountant, num_clients, sample_size, neighboring, value_discretization_interval
    ).epsilon()


def epsilon_local(
    z: float,
    releases: int,
    delta: float,
    accountant: str = "pld",
    *,
    value_discretization_interval: float | None = None,
) -> float:
    """Local-DP ε of one client that released ``releases`` noised updates x̄ + N(0, (zC)²)
    (``local`` placement): Gaussian releases under replace-one (any two inputs of the client,
    sensitivity 2C), no amplification (the server sees who took part)."""
    return epsilon(
        z,
        None,
        releases,
        delta,
        sampling="none",
        accountant=accountant,
        neighboring="replace_one",
        value_discretization_interval=value_discretization_interval,
    )


def _calibrate_at(
    acc: Accountant,
    base: RoundRecord,
    rounds: int,
    delta: float,
    target: float,
    tol: float,
    interval: float | None,
    start: float,
) -> float:
    """The smallest z (within ``tol``) whose ε is at most ``target`` for ``acc``'s accountant
    (PLD at the fixed ``interval``): brackets z by doubling/halving from ``start``, then
    ``dp_accounting.calibrate_dp_mechanism`` (Brent's method, a fresh accountant per trial)."""

    def fresh() -> dpa.PrivacyAccountant:
        return acc.fresh(interval)

    def make_event(z: float) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(acc.accounting_event(replace(base, z=float(z)).event()), rounds)

    def gap(z: float) -> float:
        with np.errstate(over="ignore", divide="ignore"):
            return fresh().compose(make_event(z)).get_epsilon(delta) - target

    lo, hi = start, start
    if gap(start) > 0:
        while True:
            lo, hi = hi, hi * 2
            if hi > _Z_CEIL:
                raise ValueError(f"target_eps={target:g} needs z > 2^30; the target is unreachable in practice")
            if gap(hi) <= 0:
                break
    else:
        while True:
            hi, lo = lo, lo / 2
            if lo < _Z_FLOOR:
                raise ValueError(
                    f"target_eps={target:g} is already met with z={hi:g} (epsilon={gap(hi) + target:.4g}); calibration "
                    f"below z={_Z_FLOOR} is refused: such an epsilon is no meaningful privacy guarantee"
                )
            if gap(lo) > 0:
                break
    with np.errstate(over="ignore", divide="ignore"):
        z = dpa.calibrate_dp_mechanism(
            fresh, make_event, target, delta, bracket_interval=dpa.ExplicitBracketInterval(lo, hi), tol=tol
        )
    return float(z)


def calibrate_noise(
    target_eps: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
    tol: float = CALIBRATION_TOL,
    value_discretization_interval: float | None = None,
) -> float:
    """The smallest noise multiplier z whose ε after ``rounds`` rounds is at most ``target_eps``.

    Brackets z by doubling/halving from 1, then runs ``dp_accounting.calibrate_dp_mechanism``
    (Brent's method with a fresh accountant per trial). Tolerance: the result is within ``tol``
    (absolute, in z; default 1e-4) of the exact minimum z* for this accountant, and never below
    the budget: ``epsilon(result) <= target_eps`` (dp-accounting re-checks and falls back to
    bisection). Refuses targets that need z < 0.125 (ε in the hundreds) or z > 2^30.
    ``rounds = 0`` returns 0.

    PLD without a fixed interval: calibrate at the interval :func:`epsilon` would report for
    ε = ``target_eps`` when its first refinement settles (half of :func:`first_interval`), then
    check the result with :func:`epsilon` itself — the value the engine and ``fedsafe privacy calibrate`` report. Where that check
    settles on another interval and exceeds the target, recalibrate at that interval (at most
    three times), then raise z by ``tol`` until the check passes.
    """
    t = float(target_eps)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"target_eps must be a finite number > 0, got {target_eps!r}")
    d = _check_delta(delta)
    rounds = _check_count("rounds", rounds, 0)
    tol = float(tol)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be > 0, got {tol!r}")
    acc = Accountant(
        d,
        accountant,
        neighboring or natural_neighboring(sampling),
        value_discretization_interval=value_discretization_interval,
    )
    base = make_round_record(1.0, q, sampling, num_clients, sample_size)
    acc.check_supported(base)
    if rounds == 0:
        return 0.0
    if not acc.engine.chooses_interval:
        return _calibrate_at(acc, base, rounds, d, t, tol, acc.value_discretization_interval, 1.0)

    def checked(z: float) -> EpsilonDetails:
        return Accountant(d, acc.accountant, acc.neighboring).compose_round(
            z, q, sampling, num_clients=num_clients, sample_size=sample_size, count=rounds
        ).epsilon_details()

    z, interval = 1.0, first_interval(t, rounds) / 2  # epsilon() reports after at least one halving
    for _ in range(3):
        z = _calibrate_at(acc, base, rounds, d, t, tol, interval, z)
        result = checked(z)
        if result.epsilon <= t or result.interval is None or result.interval == interval:
            break
        interval = result.interval
    for _ in range(1000):
        if checked(z).epsilon <= t:
            return z
        z += tol
    raise RuntimeError(f"calibration to target_eps={t:g} did not settle (last z={z:g})")


# --------------------------------------------------------------------------- CLI bodies


def epsilon_table(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
) -> dict[str, Any]:
    """ε under both accountants, for ``fedsafe privacy epsilon``.

    Returns ``{"z", "q", "rounds", "delta", "sampling", "num_clients", "sample_size",
    "neighboring", "epsilon": {"rdp": float | None, "pld": float | None}, "unsupported":
    {accountant: message}, "details": {accountant: EpsilonDetails}}``; an accountant that cannot
    account the combination has ε None and its reason under ``unsupported``. Where PLD is not run
    (huge ε) its ε is the RDP bound and ``details["pld"].note`` says so. Invalid inputs raise
    ValueError.
    """
    rel = neighboring or natural_neighboring(sampling)
    out: dict[str, Any] = {
        "z": z,
        "q": q,
        "rounds": rounds,
        "delta": delta,
        "sampling": sampling,
        "num_clients": num_clients,
        "sample_size": sample_size,
        "neighboring": rel,
        "epsilon": {},
        "unsupported": {},
        "details": {},
    }
    for name in _table_accountants():
        try:
            acc = _one_shot(z, q, rounds, delta, sampling, name, num_clients, sample_size, rel, None)
            details = acc.epsilon_details()
            out["epsilon"][name] = details.epsilon
            out["details"][name] = details
        except UnsupportedAccountingError as err:
            out["epsilon"][name] = None
            out["unsupported"][name] = str(err)
    return out


def format_epsilon_table(table: dict[str, Any]) -> str:
    """Human-readable lines for :func:`epsilon_table`'s result."""
    head = (
        f"z={table['z']:g} rounds={table['rounds']} delta={table['delta']:g} "
        f"sampling={SHOWN_SAMPLING.get(table['sampling'], table['sampling'])}"
    )
    if table["sampling"] == "poisson":
        head += f" q={table['q']:g}"
    elif table["sampling"] == "fixed":
        head += f" N={table['num_clients']} " + (
            f"m={table['sample_size']}" if table["sample_size"] is not None else f"q={table['q']:g}"
        )
    lines = [f"{head} neighboring={table['neighboring']}"]
    for name in _table_accountants():
        eps = table["epsilon"].get(name)
        if eps is None:
            lines.append(f"  {name.upper()}: unsupported — {table['unsupported'].get(name, '')}")
        else:
            details = table.get("details", {}).get(name)
            line = f"  {name.upper()}: epsilon = {eps:.4f}"
            if details is not None and details.method == "pld" and details.interval is not None:
                line += f"  (discretization interval {details.interval:.3g})"
            lines.append(line)
            if details is not None and details.note:
                lines.append(f"    note: {details.note}")
    return "\n".join(lines)


def calibration_report(
    target_eps: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
) -> dict[str, Any]:
    """Calibrated z and the ε it achieves, for ``fedsafe privacy calibrate``."""
    rel = neighboring or natural_neighboring(sampling)
    z = calibrate_noise(
        target_eps, q, rounds, delta, sampling, accountant, num_clients, sample_size=sample_size, neighboring=rel
    )
    achieved = epsilon(z, q, rounds, delta, sampling, accountant, num_clients, sample_size=sample_size, neighboring=rel)
    return {
        "target_epsilon": target_eps,
        "z": z,
        "epsilon": achieved,
        "accountant": accountant,
        "neighboring": rel,
        "q": q,
        "rounds": rounds,
        "delta": delta,
        "sampling": sampling,
        "num_clients": num_clients,
        "sample_size": sample_size,
    }


def format_calibration(report: dict[str, Any]) -> str:
    """One line for :func:`calibration_report`; z is rounded *up* to 4 decimals (more noise,
    so the printed value still meets the target)."""
    z_up = math.ceil(report["z"] * 1e4) / 1e4
    return (
        f"z = {z_up:.4f}  ({report['accountant'].upper()}: epsilon = {report['epsilon']:.4f} "
        f"<= target {report['target_epsilon']:g} at delta={report['delta']:g}, "
        f"{report['rounds']} rounds, sampling={SHOWN_SAMPLING.get(report['sampling'], report['sampling'])}, "
        f"{report['neighboring']})"
    )
