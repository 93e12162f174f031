"""Time every registered aggregation rule and pre-aggregator on one (n, d) float32 matrix.

Claim measured: robust rules cost a small multiple of one read of the matrix. Each entry is
reported in milliseconds (median of the repeats, after a warm-up call) and as a ratio to
``updates.mean(0)`` timed in the same process, call for call alternated with the entry's own
calls (so a load change on a shared machine moves both), with
targets for the rules that have one (krum / multi_krum / bulyan / meamed / monna and the
clipping / arc pre-aggregators <= 5, nnm <= 8, median / trimmed_mean <= 15). Entries come from ``AGGREGATORS`` and ``PREAGGREGATORS``, so new rules appear here on
their own; required parameters are supplied from ``KNOWN_PARAMS`` (a rule that needs one not
listed there is reported as skipped).

    python benchmarks/aggregators.py [--n 50 --d 1000000 --repeats 7 --threads 2
                                      --out benchmarks/results/aggregators.json] [--quick]
                                      [--only krum,multi_krum,bulyan,nnm] [--offset 1000]

f is n // 5 unless a rule refuses it (e.g. bulyan needs n >= 4f + 3): then the largest f below
that it accepts is used, and recorded. Naive baselines: torch.median / a torch.sort slice for
median and trimmed mean; for krum, multi_krum and nnm, a Python loop over client pairs with torch
distances, timed on a column subsample and scaled linearly to d (labelled as such).
Never run by the test suite.
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50, help="clients (rows)")
    p.add_argument("--d", type=int, default=None, help="dimension (default 1e6, 1e5 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per entry (default 7, 3 with --quick)")
    p.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/aggregators.json")
    p.add_argument("--quick", action="store_true", help="smoke run: d = 1e5, 3 repeats")
    p.add_argument("--no-naive", action="store_true", help="skip the naive baselines")
    p.add_argument("--only", default=None, help="comma-separated entry names to time (default: all)")
    p.add_argument("--offset", type=float, default=0.0,
                   help="added to every entry: 1000 makes the rows look like model weights (the "
                        "distance kernel sums squared differences, so the offset costs nothing there; "
                        "the torch fallback centres on the coordinate-wise median)")
    args = p.parse_args()
    if args.d is None:
        args.d = 100_000 if args.quick else 1_000_000
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    return args


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # before torch is imported, so its OpenMP pool starts with this many threads
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import gc  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from fedsafe.robust.aggregators import AGGREGATORS  # noqa: E402
from fedsafe.robust.preaggregators import PREAGGREGATORS  # noqa: E402

TARGETS = {
    "krum": 5.0, "multi_krum": 5.0, "nnm": 8.0, "median": 15.0, "trimmed_mean": 15.0,
    "monna": 5.0, "clipping": 5.0, "arc": 5.0, "bulyan": 5.0, "meamed": 5.0,
}
# values for parameters that have no default (reserved keywords are handled separately)
KNOWN_PARAMS: dict[str, object] = {"c": 1.0}
# column subsample for the Python-loop baselines, scaled linearly to d
NAIVE_SUBSAMPLE = 50_000


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time in ms over ``repeats`` calls, after one warm-up call."""
    return statistics.median(samples_ms(fn, repeats))


def paired_ms(fn: Callable[[], object], base: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Wall times in ms of ``fn`` and of ``base``, alternated call by call after a warm-up of
    each, so that both see the same background load (other processes share this machine)."""
    fn()
    base()
    a: list[float] = []
    b: list[float] = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            base()
            t1 = time.perf_counter()
            fn()
            t2 = time.perf_counter()
            b.append((t1 - t0) * 1e3)
            a.append((t2 - t1) * 1e3)
    finally:
        if gc_was:
            gc.enable()
    return a, b


def samples_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall times in ms of ``repeats`` calls, after one warm-up call."""
    fn()
    samples = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    return [t * 1e3 for t in samples]


def call_kwargs(registry, name: str, f: int, seed: int) -> tuple[dict, Callable[[], dict]]:
    """(user params, factory of the full kwargs) for one registry entry. Reserved keywords:
    f; previous=None (first round); generator = a fresh seeded torch.Generator per call
    (the inputs FLTrust and FoolsGold take are bound by :func:`with_round_inputs`)."""
    entry = registry.entry(name)
    sig = inspect.signature(entry.impl)
    params = {}
    for pname, p in entry.params.items():
        if p.default is inspect.Parameter.empty:
            if pname not in KNOWN_PARAMS:
                raise LookupError(f"needs parameter {pname!r}: add it to KNOWN_PARAMS")
            params[pname] = KNOWN_PARAMS[pname]
    reserved = {k for k in sig.parameters if k in registry.reserved}

    def make() -> dict:
        kw = dict(params)
        if "f" in reserved:
            kw["f"] = f
        if "previous" in reserved:
            kw["previous"] = None
        if "generator" in reserved:
            kw["generator"] = torch.Generator().manual_seed(seed)
        return kw

    return params, make


def with_round_inputs(registry, name: str, impl: Callable) -> Callable:
    """``impl`` with the reserved inputs a round supplies bound to stand-ins: ``server_update``
    (FLTrust's view of the server's own update) to the first row of the updates, an update of
    the same kind computed by no one; ``client_ids`` to rows 0..n-1, with no ``history``
    (FoolsGold's first round). A rule with a ``state`` (FLDetector) gets one warmed up on the
    rows moving a little for a full window (its rule's defaults), the model moving too, so the call
    timed is a steady-state round: its scoring, detection and base rule, recording nothing. The
    timing is then the rule's alone."""
    wanted = set(inspect.signature(impl).parameters) & set(registry.reserved)
    warmed: dict[tuple[int, ...], Any] = {}

    def state_for(updates, f):
        key = tuple(updates.shape)
        if key not in warmed:
            entry = registry.entry(name)
            state = entry.meta["state"](**{k: p.default for k, p in entry.params.items()})
            g = torch.Generator().manual_seed(0)
            ids = tuple(range(updates.shape[0]))
            for _ in range(state.window + 1):
                delta = 1e-3 * torch.randn(updates.shape[1], generator=g)
                moved = updates + 1e-2 * torch.randn(updates.shape, generator=g, dtype=updates.dtype)
                impl(moved, f=f, client_ids=ids, state=state, model_delta=delta, commit=True,
                     generator=torch.Generator().manual_seed(1))
            warmed[key] = (state, delta)
        return warmed[key]

    def call(updates, **kw):
        if "server_update" in wanted:
            kw["server_update"] = updates[0]
        if "client_ids" in wanted:
            kw["client_ids"] = tuple(range(updates.shape[0]))
        if "history" in wanted:
            kw["history"] = {}
        if "state" in wanted:
            kw["state"], kw["model_delta"] = state_for(updates, kw.get("f", 0))
        return impl(updates, **kw)

    return call if wanted & {"server_update", "client_ids"} else impl


def pick_f(impl: Callable, make_kwargs: Callable[[int], dict], x_small: Tensor, f0: int) -> int:
    """Largest f <= f0 the rule accepts (checked on a narrow slice, so it costs nothing)."""
    for f in range(f0, -1, -1):
        try:
            impl(x_small, **make_kwargs(f))
            return f
        except ValueError:
            continue
    raise ValueError("no f >= 0 accepted")


# ----------------------------------------------------------------------------- naive baselines


def naive_pairwise(x: Tensor) -> Tensor:
    n = x.shape[0]
    d2 = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1, n):
            d2[i, j] = d2[j, i] = float(torch.sum((x[i] - x[j]) ** 2))
    return d2


def naive_krum_scores(d2: Tensor, f: int) -> Tensor:
    n = d2.shape[0]
    return torch.stack(
        [torch.sort(torch.cat([d2[i, :i], d2[i, i + 1 :]])).values[: n - f - 2].sum() for i in range(n)]
    )


def naive_krum(x: Tensor, f: int) -> Tensor:
    return x[int(torch.argmin(naive_krum_scores(naive_pairwise(x), f)))].clone()


def naive_multi_krum(x: Tensor, f: int) -> Tensor:
    n = x.shape[0]
    keep = torch.sort(naive_krum_scores(naive_pairwise(x), f), stable=True).indices[: n - f]
    return torch.stack([x[int(i)] for i in keep]).mean(dim=0)


def naive_nnm(x: Tensor, f: int) -> Tensor:
    n = x.shape[0]
    d2 = naive_pairwise(x)
    rows = []
    for i in range(n):
        nearest = torch.sort(d2[i], stable=True).indices[: n - f]
        rows.append(torch.stack([x[int(j)] for j in nearest]).mean(dim=0))
    return torch.stack(rows)


def naive_for(name: str, x: Tensor, f: int, repeats: int) -> tuple[float | None, str]:
    """(ms, note) of the naive baseline for ``name``, or (None, "n/a")."""
    n, d = x.shape
    if name == "median":
        return timed(lambda: torch.median(x, dim=0), repeats), "torch.median(dim=0)"
    if name == "trimmed_mean":
        return timed(lambda: torch.sort(x, dim=0).values[f : n - f].mean(dim=0), repeats), "torch.sort slice mean"
    loops = {"krum": naive_krum, "multi_krum": naive_multi_krum, "nnm": naive_nnm}
    if name in loops:
        b = min(d, NAIVE_SUBSAMPLE)
        sub = x[:, :b].contiguous()
        ms = timed(lambda: loops[name](sub, f), max(1, min(repeats, 3))) * d / b
        note = "pair loop" + (f" @d={b} x{d / b:g}" if b < d else "")
        return ms, note
    return None, "n/a"


# ----------------------------------------------------------------------------- report


def print_table(rows: list[dict], mean_ms: float, header: str) -> None:
    cols = ["name", "kind", "f", "ms", "mean ms", "x mean", "target", "ok", "naive ms", "naive x", "note"]
    table = []
    for r in rows:
        table.append([
            r["name"], r["kind"], "" if r.get("f") is None else str(r["f"]),
            "" if r.get("ms") is None else f"{r['ms']:.1f}",
            "" if r.get("mean_ms_paired") is None else f"{r['mean_ms_paired']:.1f}",
            "" if r.get("ratio_to_mean") is None else f"{r['ratio_to_mean']:.2f}",
            "" if r.get("target_ratio") is None else f"<= {r['target_ratio']:g}",
            {True: "pass", False: "FAIL", None: ""}[r.get("pass")],
            "n/a" if r.get("naive_ms") is None else f"{r['naive_ms']:.1f}",
            "" if r.get("naive_ratio") is None else f"{r['naive_ratio']:.1f}",
            r.get("error") or r.get("naive_note", ""),
        ])
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=header)
        for c in cols:
            t.add_column(c, justify="left" if c in ("name", "kind", "note") else "right")
        for row in table:
            t.add_row(*row)
        Console(width=max(150, Console().width)).print(t)
    except ImportError:  # plain text
        print(header)
        widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
        for row in table:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    n, d = args.n, args.d
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(args.seed), dtype=torch.float32)
    if args.offset:
        x += args.offset
    x_small = x[:, :64].contiguous()
    f_default = n // 5
    load_start = os.getloadavg()

    # the ratio base: samples before and after all entries, pooled (drift shows in the JSON)
    def mean_fn() -> Tensor:
        return x.mean(dim=0)

    mean_start = samples_ms(mean_fn, args.repeats)
    rows: list[dict] = []
    for kind, registry in (("aggregator", AGGREGATORS), ("pre-aggregator", PREAGGREGATORS)):
        for name in registry.names():
            if args.only is not None and name not in args.only.split(","):
                continue
            row: dict = {"name": name, "kind": kind, "target_ratio": TARGETS.get(name)}
            rows.append(row)
            impl = with_round_inputs(registry, name, registry.entry(name).impl)
            try:
                params, _ = call_kwargs(registry, name, 0, args.seed)
                row["params"] = params

                def make(f: int, registry=registry, name=name) -> dict:
                    return call_kwargs(registry, name, f, args.seed)[1]()

                f = pick_f(impl, make, x_small, f_default)
                row["f"] = f
                rule_ms, base_ms = paired_ms(lambda impl=impl, f=f: impl(x, **make(f)), mean_fn, args.repeats)
                ms = row["ms"] = statistics.median(rule_ms)
                row["mean_ms_paired"] = statistics.median(base_ms)
                row["ms_samples"] = rule_ms
            except Exception as e:  # one broken or new rule must not stop the run
                row["error"] = f"{type(e).__name__}: {e}"[:120]
                row["pass"] = None
                print(f"  {name}: {row['error']}", file=sys.stderr)
                continue
            if not args.no_naive:
                row["naive_ms"], row["naive_note"] = naive_for(name, x, row["f"], args.repeats)
            print(f"  {kind} {name}: {ms:.1f} ms", file=sys.stderr)
    mean_end = samples_ms(mean_fn, args.repeats)
    mean_ms = statistics.median(mean_start + mean_end)
    mean_samples = [statistics.median(mean_start), statistics.median(mean_end)]
    for row in rows:
        if row.get("ms") is not None:
            # against the mean calls interleaved with this entry's: robust to load drifting
            row["ratio_to_mean"] = row["ms"] / row["mean_ms_paired"]
            if row.get("naive_ms") is not None:
                row["naive_ratio"] = row["naive_ms"] / mean_ms
            t = row["target_ratio"]
            row["pass"] = None if t is None else row["ratio_to_mean"] <= t

    try:
        import numba

        numba_version = numba.__version__
    except ImportError:
        numba_version = None
    result = {
        "config": {
            "n": n, "d": d, "dtype": "float32", "threads": args.threads, "repeats": args.repeats,
            "seed": args.seed, "f_default": f_default, "quick": args.quick, "only": args.only,
            "offset": args.offset,
            "mean_ms": mean_ms, "mean_ms_start_end": mean_samples,
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
            "torch": torch.__version__, "numba": numba_version, "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
        },
        "entries": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    header = (f"n={n} d={d} float32, {args.threads} threads, median of {args.repeats}; "
              f"mean(0) = {mean_ms:.2f} ms (start {mean_samples[0]:.2f}, end {mean_samples[1]:.2f}); "
              f"load {load_start[0]:.2f} -> {result['config']['loadavg_end'][0]:.2f}")
    print_table(rows, mean_ms, header)
    print(f"wrote {out}")
    failed = [r["name"] for r in rows if r.get("pass") is False]
    if failed:
        print(f"over target: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
