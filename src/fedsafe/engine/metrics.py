"""Per-round metrics (``metrics.jsonl``) and the run summary (``summary.json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


def _clean(v: Any) -> Any:
    # JSON has no NaN/Inf; a non-finite figure is written as null rather than corrupting the file.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsWriter:
    """Appends one JSON object per round, flushed, so a killed run keeps what it finished."""

    def __init__(self, out_dir: Path | None) -> None:
        self.path = None if out_dir is None else Path(out_dir) / METRICS

    def write(self, row: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def truncate_after(self, round_: int) -> list[dict[str, Any]]:
        """Drop rows after ``round_`` (a resumed run redoes them); return the rows kept."""
        if self.path is None or not self.path.exists():
            return []
        rows = read_metrics(self.path.parent)
        kept = [r for r in rows if r["round"] <= round_]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return kept


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            # Only the last line can be torn (the process was killed mid-write): drop it.
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not valid JSON") from None
    return rows


def summarize(rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Final and best accuracy, rounds, wall seconds, plus the last value of privacy figures."""
    evals = [r for r in rows if r.get("test_accuracy") is not None]
    summary: dict[str, Any] = {
        "rounds": rows[-1]["round"] if rows else 0,
        "final_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "best_accuracy": max((r["test_accuracy"] for r in evals), default=None),
        "final_test_loss": evals[-1]["test_loss"] if evals else None,
        "wall_seconds": sum(r.get("seconds", 0.0) for r in rows),
        "bytes_up": sum(r.get("bytes_up", 0.0) for r in rows),
        "bytes_down": sum(r.get("bytes_down", 0.0) for r in rows),
        "skipped_rounds": sum(1 for r in rows if r.get("skipped")),
        "excluded_nonfinite": sum(r.get("excluded_nonfinite", 0.0) for r in rows),
    }
    asr = [r["attack_success_rate"] for r in rows if r.get("attack_success_rate") is not None]
    if asr:  # a backdoor attack: the success rate of the evaluated model at the end
        summary["final_attack_success_rate"] = asr[-1]
    # Privacy figures (epsilon, ...) are cumulative: the summary reports the last round's value.
    for key in ("epsilon", "delta"):
        vals = [r[key] for r in rows if r.get(key) is not None]
        if vals:
            summary[key] = vals[-1]
    summary.update(resolved_settings(rows))  # what "auto" protocol settings resolved to
    summary.update(extra)
    return summary


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    (Path(out_dir) / SUMMARY).write_text(json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2) + "\n")


# --- quantization and chance-level warnings ------------------------------------------------

#: resolved settings a protocol reports in each row ("auto" ranges, issue #29): the summary
#: gets the last value, and the smallest and largest when they changed across rounds
RESOLVED_KEYS = ("he_range", "tee_clip", "secagg_range")
#: a final accuracy at most this many times 1/num_classes counts as chance level
CHANCE_FACTOR = 1.5


def resolved_settings(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The last value of each of :data:`RESOLVED_KEYS` the rows report, plus ``KEY_min`` and
    ``KEY_max`` when it changed across rounds."""
    out: dict[str, float] = {}
    for key in RESOLVED_KEYS:
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if not vals:
            continue
        out[key] = vals[-1]
        if min(vals) != max(vals):
            out[f"{key}_min"], out[f"{key}_max"] = min(vals), max(vals)
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]
    return sum(vals) / len(vals) if vals else None


def likely_culprits(cfg: Any, rows: list[dict[str, Any]], dim: int | None = None) -> list[str]:
    """The settings the run's own counters point to when it trains nothing, one line each,
    naming the key to change: quantization that erases or clips the messages (``he.range``,
    ``secagg.range``, ``tee.clip``), DP noise that swamps them (``dp.clip``,
    ``dp.noise_multiplier``, ``dp.placement``), a non-robust rule under attack
    (``robust.rule``) and skipped rounds. Averages over the second half of the rounds (the
    first ones of a momentum run are small). ``dim``: the message dimension, for the ratio of
    the DP noise's norm to the clip."""
    late = rows[len(rows) // 2 :] or rows
    out: list[str] = []
    zeroed, clipped = _mean(late, "he_zeroed_fraction"), _mean(late, "he_clipped_fraction")
    he_range = _mean(late, "he_range")
    if zeroed is not None and zeroed > 0.9:
        out.append(
            f"he.range = {he_range:.3g} rounds {zeroed:.0%} of the honest coordinates to 0 (he_zeroed_fraction): "
            "set he.range = 'auto', or lower it, or raise he.bits"
        )
    if clipped is not None and clipped > 0.5:
        out.append(
            f"he.range = {he_range:.3g} clips {clipped:.0%} of the honest coordinates (he_clipped_fraction): "
            "set he.range = 'auto', or raise it"
        )
    sa = _mean(late, "secagg_clipped_fraction")
    if sa is not None and sa > 0.1:
        out.append(
            f"secagg.range clips {sa:.0%} of the coordinates (secagg_clipped_fraction): set secagg.range = 'auto', "
            "or raise it"
        )
    tee = [float(r["clipped"]) / max(1.0, float(r.get("participants", 1))) for r in late
           if isinstance(r.get("clipped"), (int, float)) and "tee_clip" in r]
    if tee and sum(tee) / len(tee) > 0.9:
        out.append(
            f"tee.clip = {_mean(late, 'tee_clip'):.3g} clips {sum(tee) / len(tee):.0%} of the updates: set "
            "tee.clip = 'auto', or raise it"
        )
    dp = getattr(cfg, "dp", None)
    if dp is not None and dp.enabled:
        z = dp.noise_multiplier if dp.noise_multiplier is not None else 1.0
        cf = _mean(late, "clipped_fraction")
        zo = getattr(cfg.clients, "gradient", "backprop") == "zeroth_order"
        if getattr(dp, "unit", "client") == "example":
            out.append(
                f"dp.unit = 'example' (DP-SGD) adds noise of std z·C/B = {z:g} x {dp.clip:g} / {cfg.clients.batch_size} to "
                "every coordinate of every client's step gradient: lower dp.noise_multiplier or raise clients.batch_size"
            )
        elif dp.placement == "local":
            out.append(
                f"dp.placement = 'local' adds noise of std z·C = {z:g} x {dp.clip:g} to every coordinate of every "
                "client's message: lower dp.noise_multiplier, or use dp.placement = 'central' or 'distributed' "
                "(noise once on the sum)"
            )
        else:
            m = _mean(rows, "participants") or float(cfg.clients.num_clients)
            if dim is not None and m > 0 and z * math.sqrt(dim) / m > 1.0:
                out.append(
                    f"the DP noise's norm, dp.noise_multiplier x dp.clip x sqrt(d) / clients = {z:g} x C x "
                    f"sqrt({dim}) / {m:g}, is {z * math.sqrt(dim) / m:.1f}x the clip C that bounds the clients' "
                    "mean update: raise clients.num_clients (or the sample), or lower dp.noise_multiplier"
                )
        if dp.placement != "local" and cf is not None and cf < 0.05 and not dp.adaptive:
            out.append(
                f"dp.clip = {dp.clip:g} is above {1 - cf:.0%} of the clients' message norms (clipped_fraction), so the "
                f"noise (std {z:g} x dp.clip) may swamp messages far smaller than the clip"
                + (" (zeroth-order messages are K loss differences, orders of magnitude below gradients)" if zo else "")
                + ": lower dp.clip towards the messages' norm, or set dp.adaptive = true"
            )
    attack = getattr(cfg, "attack", None)
    if attack is not None and attack.name != "none" and attack.f > 0 and cfg.robust.rule == "mean" and not cfg.robust.pre:
        out.append(
            f"robust.rule = 'mean' does not resist attack.name = '{attack.name}' with attack.f = {attack.f}: choose a "
            "robust rule (protocol = 'secagg' and DP placements 'central' / 'distributed' allow only the mean)"
        )
    skipped = [r for r in rows if r.get("skipped")]
    if len(skipped) > len(rows) // 2:
        out.append(f"{len(skipped)} of {len(rows)} rounds were skipped (first reason: {skipped[0]['skipped']})")
    return out


def chance_level_message(
    cfg: Any, rows: list[dict[str, Any]], num_classes: int, dim: int | None = None
) -> str | None:
    """The end-of-run warning of a run whose final accuracy is at chance level (at most
    :data:`CHANCE_FACTOR` / ``num_classes``), naming :func:`likely_culprits`; None otherwise."""
    evals = [r for r in rows if r.get("test_accuracy") is not None]
    if not evals or num_classes < 2:
        return None
    acc = float(evals[-1]["test_accuracy"])
    chance = 1.0 / num_classes
    if acc > CHANCE_FACTOR * chance:
        return None
    culprits = likely_culprits(cfg, rows, dim)
    why = "; ".join(culprits) if culprits else (
        "no quantization, DP or attack counter points to a culprit: check server.lr, clients.lr and rounds"
    )
    return (
        f"the run ended at chance level: final accuracy {acc:.1%} with {num_classes} classes (chance {chance:.1%}). "
        f"Likely culprit(s): {why}"
    )


def warn_at_chance(cfg: Any, rows: list[dict[str, Any]], num_classes: int, dim: int | None = None) -> str | None:
    """Warn (a ``UserWarning`` starting "the run ended at chance level") at the end of a run
    that ended at chance level; returns the message (None: no warning)."""
    import warnings

    msg = chance_level_message(cfg, rows, num_classes, dim)
    if msg is not None:
        warnings.warn(msg, UserWarning, stacklevel=3)
    return msg
