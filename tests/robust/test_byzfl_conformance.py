"""Conformance with ByzFL 0.0.11 (the peer library ``byzfl``): fedsafe's rules, pre-aggregators
and attacks against ByzFL's on identical inputs.

Where both libraries define the same thing the outputs are compared; where a convention differs
a test named ``test_<thing>_convention_<difference>`` pins the difference exactly (both values,
or the map from one parameterisation onto the other) and states it in its docstring.

Loading: ``import byzfl`` imports torchvision (through ``byzfl.fed_framework``), which is not
installed, so ``byzfl/__init__.py`` is never run. The fixture registers bare package modules for
``byzfl``, ``byzfl.utils``, ``byzfl.aggregators`` and ``byzfl.attacks`` (their ``__init__`` files
only star-import their submodules, or import torchvision), loads ``utils/torch_tools.py``,
``utils/misc.py``, ``aggregators/aggregators.py``, ``aggregators/preaggregators.py`` and
``attacks/attacks.py`` from their files, gives the bare ``byzfl.aggregators`` the names
``attacks.py`` imports from it, and restores ``sys.modules`` afterwards. Without byzfl 0.0.11
(install: ``pip install --no-deps byzfl==0.0.11``) every test here is skipped.

Inputs are float64 numpy arrays: ByzFL casts torch tensors to float32 (pinned below), numpy
arrays it keeps in float64.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsafe.core.errors import RequirementError
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.attacks import ATTACKS, AttackContext, alie_z
from fedsafe.robust.preaggregators import PREAGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive

BYZFL_VERSION = "0.0.11"
D = 20


# ---------------------------------------------------------------------------------- loading


def _load_byzfl() -> types.SimpleNamespace:
    spec = importlib.util.find_spec("byzfl")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("byzfl is not installed (pip install --no-deps byzfl==0.0.11)")
    version = importlib.metadata.version("byzfl")
    if version != BYZFL_VERSION:
        raise LookupError(f"byzfl {version} is installed; these pins are for {BYZFL_VERSION}")
    root = Path(next(iter(spec.submodule_search_locations)))

    def package(name: str, folder: Path) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        sys.modules[name] = module
        return module

    def module(name: str, file: Path) -> types.ModuleType:
        mspec = importlib.util.spec_from_file_location(name, file)
        if mspec is None or mspec.loader is None:
            raise LookupError(f"cannot load {file}")
        mod = importlib.util.module_from_spec(mspec)
        sys.modules[name] = mod
        mspec.loader.exec_module(mod)
        return mod

    package("byzfl", root)
    package("byzfl.utils", root / "utils")
    module("byzfl.utils.torch_tools", root / "utils" / "torch_tools.py")
    module("byzfl.utils.misc", root / "utils" / "misc.py")
    aggregators_pkg = package("byzfl.aggregators", root / "aggregators")
    agg = module("byzfl.aggregators.aggregators", root / "aggregators" / "aggregators.py")
    pre = module("byzfl.aggregators.preaggregators", root / "aggregators" / "preaggregators.py")
    for source in (agg, pre):  # what byzfl/aggregators/__init__.py star-imports
        for key, value in vars(source).items():
            if not key.startswith("_"):
                setattr(aggregators_pkg, key, value)
    package("byzfl.attacks", root / "attacks")
    atk = module("byzfl.attacks.attacks", root / "attacks" / "attacks.py")
    return types.SimpleNamespace(agg=agg, pre=pre, atk=atk)


@pytest.fixture(scope="module")
def byz():
    saved = {k: v for k, v in sys.modules.items() if k == "byzfl" or k.startswith("byzfl.")}
    try:
        loaded = _load_byzfl()
    except Exception as err:  # noqa: BLE001  (not installed, another version, or any failure to load)
        _restore(saved)
        pytest.skip(f"ByzFL conformance skipped: {type(err).__name__}: {err}")
    yield loaded
    _restore(saved)


def _restore(saved: dict) -> None:
    for key in [k for k in sys.modules if k == "byzfl" or k.startswith("byzfl.")]:
        del sys.modules[key]
    sys.modules.update(saved)


@pytest.fixture
def exact_power_start(monkeypatch):
    """Make ByzFL's CAF / SMEA eigenvalues exact: their power method takes ONE step from
    ``np.random.randn(d)``; starting it at the exact top eigenvector of the (weighted)
    covariance it is working on (read from the caller's ``diffs`` and weights ``c``) makes the
    step return that eigenpair. Only the eigen-solver changes, not the rule."""
    draw = np.random.randn

    def start(*shape):
        caller = sys._getframe(1).f_locals
        if "diffs" not in caller:
            return draw(*shape)
        diffs = np.asarray(caller["diffs"], dtype=np.float64)
        c = np.asarray(caller.get("c", np.ones(len(diffs))), dtype=np.float64)
        return np.linalg.eigh((diffs * c[:, None]).T @ diffs)[1][:, -1]

    monkeypatch.setattr(np.random, "randn", start)


# ---------------------------------------------------------------------------------- helpers


def _data(kind: str, n: int, seed: int = 0, d: int = D) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return 1 + rng.standard_normal((n, d))
    if kind == "ties":  # integer entries (exact distances) and duplicated rows
        x = rng.integers(-2, 3, (n, d)).astype(np.float64)
        x[3] = x[1]
        x[n - 1] = x[1]
        return x
    if kind == "outliers":  # two far rows, in their own directions
        x = 1 + rng.standard_normal((n, d))
        x[1] = 1e6 * rng.standard_normal(d)
        x[4] = 1e6 * rng.standard_normal(d)
        return x
    raise AssertionError(kind)


def fs_rule(name: str, x: np.ndarray, f: int, **params) -> np.ndarray:
    return AGGREGATORS.get(name, params)(torch.from_numpy(x.copy()), f=f).numpy()


def fs_pre(name: str, x: np.ndarray, f: int, **params) -> np.ndarray:
    return PREAGGREGATORS.get(name, params)(torch.from_numpy(x.copy()), f=f).numpy()


def ctx_for(honest: np.ndarray, f: int, seed: int = 0, state: dict | None = None) -> AttackContext:
    return AttackContext(
        f=f, n=len(honest) + f, round=0, generator=torch.Generator().manual_seed(seed),
        aggregate=lambda u: u.mean(dim=0), state={} if state is None else state,
    )


def fs_attack(name: str, honest: np.ndarray, f: int, **params) -> np.ndarray:
    return ATTACKS.get(name, params)(torch.from_numpy(honest.copy()), ctx=ctx_for(honest, f)).numpy()


def close(a, b, rtol: float = 1e-10) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * (1.0 + float(np.abs(b).max())))


SHAPES = [(11, 2), (12, 3), (7, 1)]
KINDS = ["gaussian", "ties", "outliers"]
CASES = [(n, f, kind, seed) for n, f in SHAPES for kind in KINDS for seed in (0, 1)]
CASE_IDS = [f"n{n}-f{f}-{kind}-s{seed}" for n, f, kind, seed in CASES]
NO_TIES = [c for c in CASES if c[2] != "ties"]
NO_TIES_IDS = [f"n{n}-f{f}-{kind}-s{seed}" for n, f, kind, seed in NO_TIES]


# ------------------------------------------------------------ aggregators: the same definition

# (ByzFL constructor from f, fedsafe name, fedsafe params, tie-free inputs only)
SAME = {
    "Average": (lambda m, f: m.Average(), "mean", {}, False),
    "Median": (lambda m, f: m.Median(), "median", {}, False),
    "TrMean": (lambda m, f: m.TrMean(f), "trimmed_mean", {}, False),
    "MDA": (lambda m, f: m.MDA(f), "mda", {}, False),
    "CenteredClipping": (lambda m, f: m.CenteredClipping(L=2, tau=3.0), "centered_clipping", {"tau": 3.0, "iters": 2}, False),
    # ByzFL selects the k nearest / closest with argpartition, whose choice among equal
    # distances is unspecified: tie-free inputs only (ties are pinned separately)
    "MoNNA": (lambda m, f: m.MoNNA(f, idx=2), "monna", {"reference": 2}, True),
    "Meamed": (lambda m, f: m.Meamed(f), "meamed", {}, True),
}


SAME_CASES = [(key, *case) for key in sorted(SAME) for case in (NO_TIES if SAME[key][3] else CASES)]


@pytest.mark.parametrize("byz_name,n,f,kind,seed", SAME_CASES,
                         ids=[f"{c[0]}-n{c[1]}-f{c[2]}-{c[3]}-s{c[4]}" for c in SAME_CASES])
def test_aggregator_same_definition(byz, byz_name, n, f, kind, seed):
    make, name, params, _ = SAME[byz_name]
    x = _data(kind, n, seed)
    close(fs_rule(name, x, f, **params), make(byz.agg, f)(x.copy()))


@pytest.mark.parametrize("n,f,kind,seed", CASES, ids=CASE_IDS)
def test_krum_matches_with_f_shifted_by_one(byz, n, f, kind, seed):
    """See test_krum_convention_neighbor_count: fedsafe's krum(f − 1) is ByzFL's Krum(f)."""
    x = _data(kind, n, seed)
    close(fs_rule("krum", x, f - 1), byz.agg.Krum(f)(x.copy()))


@pytest.mark.parametrize("n,f,kind,seed", NO_TIES, ids=NO_TIES_IDS)
def test_multi_krum_matches_with_f_shifted_and_m_explicit(byz, n, f, kind, seed):
    """See test_multi_krum_convention_*: ByzFL's MultiKrum(f) is fedsafe's multi_krum(f − 1,
    m = n − f). Tie-free inputs (ByzFL's argpartition)."""
    x = _data(kind, n, seed)
    close(fs_rule("multi_krum", x, f - 1, m=n - f), byz.agg.MultiKrum(f)(x.copy()))


@pytest.mark.parametrize("n,f,kind,seed", NO_TIES, ids=NO_TIES_IDS)
def test_geometric_median_converged_agrees(byz, n, f, kind, seed):
    """Run to convergence (ByzFL: T = 2000 steps, ν = 1e-10; fedsafe: tol = 0, max_iter = 2000,
    eps = 1e-10), both reach the same geometric median."""
    x = _data(kind, n, seed)
    ours = fs_rule("geometric_median", x, f, eps=1e-10, tol=0.0, max_iter=2000)
    theirs = byz.agg.GeometricMedian(nu=1e-10, T=2000)(x.copy())
    # fedsafe's distances come from the distance matrix: with 1e6-scale outliers its iterate
    # is accurate to ~1e-11 of the inputs' scale, not of the median's
    np.testing.assert_allclose(ours, theirs, rtol=1e-7, atol=1e-11 * np.abs(x).max())


@pytest.mark.parametrize("n,f,kind,seed", [c for c in CASES if c[2] == "gaussian"],
                         ids=[i for c, i in zip(CASES, CASE_IDS) if c[2] == "gaussian"])
def test_caf_agrees_with_exact_power_start(byz, exact_power_start, n, f, kind, seed):
    """With ByzFL's power step made exact, CAF agrees on inputs without far outliers (there
    the update ByzFL zeroes never keeps the largest projection: see
    test_caf_convention_tau_max_over_weighted_updates)."""
    x = _data(kind, n, seed)
    close(fs_rule("caf", x, f), byz.agg.CAF(f)(x.copy()), rtol=1e-9)


@pytest.mark.parametrize("n,f,kind,seed", NO_TIES, ids=NO_TIES_IDS)
def test_smea_agrees_with_exact_power_start(byz, exact_power_start, n, f, kind, seed):
    """With ByzFL's power step made exact, SMEA picks the same subset. Tie-free inputs: with
    duplicated rows ByzFL's strict ``<`` between equal eigenvalues is decided by rounding."""
    x = _data(kind, n, seed)
    close(fs_rule("smea", x, f), byz.agg.SMEA(f)(x.copy()), rtol=1e-9)


# --------------------------------------------------------------- aggregators: conventions


def test_loaded_without_running_byzfl_init(byz):
    """The fixture never runs byzfl/__init__.py: nothing of fed_framework, benchmark or
    torchvision is imported, and ``byzfl`` is the bare package module."""
    assert "torchvision" not in sys.modules
    assert not any(k.startswith(("byzfl.fed_framework", "byzfl.benchmark")) for k in sys.modules)
    assert not hasattr(sys.modules["byzfl"], "Server")
    assert byz.agg.__name__ == "byzfl.aggregators.aggregators"


def test_byzfl_convention_torch_inputs_become_float32(byz):
    """ByzFL casts torch inputs to float32 (``check_vectors_type``: ``vectors.float()``) and
    keeps numpy float64; fedsafe keeps the input's dtype. Hence numpy inputs here."""
    x = torch.from_numpy(_data("gaussian", 5, 0))
    assert byz.agg.Average()(x).dtype == torch.float32
    assert byz.agg.Average()(x.numpy()).dtype == np.float64
    assert AGGREGATORS.get("mean")(x, f=0).dtype == torch.float64


def test_median_convention_even_n_averages_the_two_middle_values(byz):
    """Even n: both take the mean of the two middle values (ByzFL: np.median /
    torch.quantile(0.5), linear interpolation; fedsafe: coordinate_median). Same convention."""
    x = np.array([[1.0, 10.0], [2.0, 40.0], [4.0, 20.0], [100.0, 30.0]])
    want = np.array([(2.0 + 4.0) / 2, (20.0 + 30.0) / 2])
    close(byz.agg.Median()(x.copy()), want, rtol=0)
    close(fs_rule("median", x, 1), want, rtol=0)
    xt = torch.from_numpy(x).float()  # ByzFL's torch path too
    close(byz.agg.Median()(xt).double().numpy(), want, rtol=0)


def test_trimmed_mean_convention_drops_f_values_at_each_end(byz):
    """Both drop the f smallest and the f largest values per coordinate and average n − 2f
    (not 2f at each end, nor f in total); f = 0 is the mean in both."""
    x = np.array([[-100.0], [1.0], [2.0], [3.0], [4.0], [200.0], [300.0]])
    for f, want in ((1, (1 + 2 + 3 + 4 + 200) / 5), (2, (2 + 3 + 4) / 3), (0, x.mean())):
        assert byz.agg.TrMean(f)(x.copy())[0] == pytest.approx(want, rel=1e-15)
        assert fs_rule("trimmed_mean", x, f)[0] == pytest.approx(want, rel=1e-15)


def test_krum_convention_neighbor_count(byz):
    """Krum's score sums (ByzFL: averages) the squared distances to the nearest others:
    fedsafe n − f − 2 of them (Blanchard et al.), ByzFL n − f − 1 (its ``[:, 1:n−f]``).
    1-D points 0, 1, 2, 10, 10.5, f = 1: fedsafe's scores (2 neighbours) are 5, 2, 5, 64.25,
    72.5 -> 1; ByzFL's (3 neighbours, summed) 105, 83, 69, 145.25, 162.75 -> 2. Mapping:
    fedsafe's krum(f − 1) = ByzFL's Krum(f) (and n ≥ 2(f−1) + 3 is ByzFL's n > 2f)."""
    x = np.array([[0.0], [1.0], [2.0], [10.0], [10.5]])
    assert fs_rule("krum", x, 1)[0] == 1.0
    assert byz.agg.Krum(1)(x.copy())[0] == 2.0
    assert fs_rule("krum", x, 0)[0] == 2.0


def test_multi_krum_convention_neighbors_and_default_m(byz):
    """MultiKrum averages the m best-scored updates, scores as in Krum, so the neighbour count
    differs as in test_krum_convention_neighbor_count; m = n − f by default in both (fixed
    in ByzFL, a parameter in fedsafe). 1-D points 0, 1, 4, 5, 7, f = 1: fedsafe's scores
    (2 neighbours) 17, 10, 10, 5, 13 keep {1, 4, 5, 7} -> 4.25; ByzFL's (3 neighbours)
    42, 26, 19, 21, 49 keep {0, 1, 4, 5} -> 2.5. Mapping: multi_krum(f − 1, m = n − f); the
    default m of the mapped call (n − f + 1 = 5) would average all five (3.4)."""
    x = np.array([[0.0], [1.0], [4.0], [5.0], [7.0]])
    assert fs_rule("multi_krum", x, 1)[0] == 4.25
    assert byz.agg.MultiKrum(1)(x.copy())[0] == 2.5
    assert fs_rule("multi_krum", x, 0, m=4)[0] == 2.5
    assert fs_rule("multi_krum", x, 0)[0] == pytest.approx(3.4, rel=1e-15)


def test_geometric_median_convention_start_smoothing_and_iterations(byz):
    """ByzFL's GeometricMedian runs exactly T = 3 smoothed Weiszfeld steps (floor ν = 0.1 on
    the distances) from z = 0; fedsafe starts at the mean, floors at eps = 1e-8 and iterates
    until the objective changes by at most 1e-6 relative (≤ 100 steps). ByzFL's default is
    the 3-step iterate written out below, ~16x farther from the geometric median here than
    fedsafe's default (which is naive.geometric_median)."""
    x = _data("gaussian", 9, 0)

    def steps(z, t, nu):  # ByzFL's recurrence, written out
        for _ in range(t):
            beta = np.maximum(np.linalg.norm(x - z, axis=1), nu)
            z = (x / beta[:, None]).sum(axis=0) / (1 / beta).sum()
        return z

    theirs = byz.agg.GeometricMedian()(x.copy())
    close(theirs, steps(np.zeros(D), 3, 0.1), rtol=1e-12)
    ours = fs_rule("geometric_median", x, 2)
    close(ours, naive.geometric_median(x, 2), rtol=1e-12)
    converged = byz.agg.GeometricMedian(nu=1e-10, T=2000)(x.copy())
    assert np.linalg.norm(theirs - converged) > 10 * np.linalg.norm(ours - converged)


def test_centered_clipping_convention_default_tau_and_state(byz):
    """Same recurrence; two conventions differ. (1) τ: ByzFL's default is a fixed 100, fedsafe's
    (tau=None) the median distance to the centre; with an explicit τ they agree. (2) State:
    ByzFL keeps the last output in the instance (``self.m``) and starts the next call from
    it, and refuses an explicit start (its type check ``not ndarray or not Tensor`` is
    always true); fedsafe takes the previous aggregate explicitly as ``previous``."""
    x = _data("gaussian", 9, 0)
    x[0] = 50.0  # ‖x_0‖ ≈ 224 > 100
    close(byz.agg.CenteredClipping()(x.copy()), fs_rule("centered_clipping", x, 2, tau=100.0))
    assert np.linalg.norm(fs_rule("centered_clipping", x, 2) - byz.agg.CenteredClipping()(x.copy())) > 1.0
    cc = byz.agg.CenteredClipping(L=1, tau=2.0)
    first = cc(x.copy())
    second = cc(x.copy())  # starts from `first`
    rule = AGGREGATORS.get("centered_clipping", {"tau": 2.0})
    t = torch.from_numpy(x)
    close(first, rule(t, f=2).numpy())
    close(second, rule(t, f=2, previous=torch.from_numpy(first)).numpy())
    with pytest.raises(TypeError):
        byz.agg.CenteredClipping(m=np.zeros(D))


def test_mda_convention_first_subset_wins_ties(byz):
    """Both enumerate itertools.combinations(range(n), n − f) and keep the first of equal
    diameters: points 0, 1, 2, 3 with f = 1 tie {0,1,2} and {1,2,3}; both keep {0,1,2}."""
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    assert byz.agg.MDA(1)(x.copy())[0] == pytest.approx(fs_rule("mda", x, 1)[0], rel=1e-15) == 1.0
    assert byz.agg.MDA(1)(x[::-1].copy())[0] == pytest.approx(fs_rule("mda", x[::-1], 1)[0], rel=1e-15) == 2.0


def test_monna_convention_reference_is_included(byz):
    """Both average the n − f nearest to x_idx, x_idx itself included (ByzFL ``idx``, fedsafe
    ``reference``). Points 0, 1, 5, 6, 20, f = 2, reference 2 (the 5): {5, 6, 1}."""
    x = np.array([[0.0], [1.0], [5.0], [6.0], [20.0]])
    assert byz.agg.MoNNA(2, idx=2)(x.copy())[0] == fs_rule("monna", x, 2, reference=2)[0] == 4.0


def test_meamed_convention_ties_at_equal_distance(byz):
    """Values 0, 2, 4 (median 2), f = 1: the n − f = 2 closest to the median are {2, 0} or
    {2, 4} at equal distance. fedsafe prefers the lower value (1.0); ByzFL takes whatever
    argpartition returns (unspecified): 1.0 or 3.0."""
    x = np.array([[0.0], [2.0], [4.0]])
    assert fs_rule("meamed", x, 1)[0] == 1.0
    assert byz.agg.Meamed(1)(x.copy())[0] in (1.0, 3.0)


def test_caf_convention_exact_eigenpair_vs_one_power_step(byz):
    """ByzFL's CAF estimates the top eigenpair by one power step from ``np.random.randn``: its
    output depends on the global numpy seed. fedsafe's eigenpair is exact: deterministic, and
    equal to ByzFL's when the power step is made exact (test_caf_agrees_with_exact_power_start)."""
    x = _data("gaussian", 9, 1, d=6)
    outputs = set()
    for seed in range(8):
        np.random.seed(seed)
        outputs.add(tuple(np.round(byz.agg.CAF(2)(x.copy()), 12)))
    assert len(outputs) > 1
    ours = fs_rule("caf", x, 2)
    np.testing.assert_array_equal(fs_rule("caf", x, 2), ours)


def test_smea_convention_exact_eigenvalue_vs_one_power_step(byz):
    """ByzFL's SMEA ranks subsets by a one-power-step estimate from ``np.random.randn``: a
    random lower bound on λ_max, so the chosen subset varies with the numpy seed. fedsafe
    ranks by the exact λ_max (and equals ByzFL's with an exact start)."""
    x = _data("gaussian", 9, 1, d=6)
    outputs = set()
    for seed in range(8):
        np.random.seed(seed)
        outputs.add(tuple(np.round(byz.agg.SMEA(2)(x.copy()), 12)))
    assert len(outputs) > 1
    close(fs_rule("smea", x, 2), naive.smea(x, 2), rtol=1e-12)


def test_caf_convention_tau_max_over_weighted_updates(byz):
    """τ_max: ByzFL takes the maximum over all n updates, fedsafe over those with weight > 0.
    1-D points 0, 1, 2, 3, 4, 100, f = 1 (1-D: the power step is exact). Step 1 zeroes the
    100; it keeps the largest projection, so in ByzFL the other weights then shrink by
    factors 1 − τ_i/τ_100 ≈ 1 for hundreds of steps (938 here; ~2·10⁵ in 20-D with an outlier
    at 10⁶), while fedsafe zeroes the farthest weighted update and stops after 2 steps (at
    most n). The outputs differ (ByzFL ≈ 2.0127, fedsafe ≈ 2.0102)."""
    x = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [100.0]])
    steps = [0]
    draw = np.random.randn

    def counting(*shape):
        steps[0] += 1
        return draw(*shape)

    np.random.randn = counting
    try:
        theirs = byz.agg.CAF(1)(x.copy())[0]
    finally:
        np.random.randn = draw
    ours = fs_rule("caf", x, 1)[0]
    assert steps[0] == 938 > len(x)
    assert theirs == pytest.approx(2.0127367, abs=1e-6)
    assert ours == pytest.approx(naive.caf(x, 1)[0], rel=1e-12)
    assert ours == pytest.approx(2.0102, abs=1e-4)


def test_caf_convention_f_zero(byz):
    """f = 0: ByzFL's ``while Σc > n − 2f`` never runs and returns None; fedsafe evaluates the
    first candidate (do-while) and returns the mean."""
    x = _data("gaussian", 6, 0)
    assert byz.agg.CAF(0)(x.copy()) is None
    close(fs_rule("caf", x, 0), x.mean(axis=0))


def test_requirement_conventions(byz):
    """What each side accepts: Krum/MultiKrum: ByzFL n > 2f, fedsafe n ≥ 2f + 3; NNM: ByzFL
    f < n, fedsafe n > 2f; ARC: ByzFL f ≤ n, fedsafe n > 2f. The rest: n > 2f in both."""
    x = _data("gaussian", 6, 0)
    byz.agg.Krum(2)(x.copy())  # n = 6 > 4
    with pytest.raises(RequirementError, match="n >= 2f \\+ 3"):
        fs_rule("krum", x, 2)
    byz.pre.NNM(4)(x.copy())
    with pytest.raises(RequirementError, match="n > 2f"):
        fs_pre("nnm", x, 4)
    byz.pre.ARC(6)(x.copy())
    with pytest.raises(RequirementError, match="n > 2f"):
        fs_pre("arc", x, 3)
    for make, name in ((byz.agg.TrMean, "trimmed_mean"), (byz.agg.MDA, "mda"), (byz.agg.SMEA, "smea"),
                       (byz.agg.CAF, "caf"), (byz.agg.Meamed, "meamed"), (byz.agg.MoNNA, "monna")):
        with pytest.raises(ValueError):
            make(3)(x.copy())
        with pytest.raises(RequirementError):
            fs_rule(name, x, 3)


# --------------------------------------------------------------------------- pre-aggregators


@pytest.mark.parametrize("n,f,kind,seed", NO_TIES, ids=NO_TIES_IDS)
def test_nnm_same_definition(byz, n, f, kind, seed):
    x = _data(kind, n, seed)
    close(fs_pre("nnm", x, f), byz.pre.NNM(f)(x.copy()))


def test_nnm_convention_neighborhood_includes_itself(byz):
    """Both: y_i is the mean of x_i's n − f nearest, x_i itself included (distance 0).
    Points 0, 1, 3, 10, 11, f = 2: y_0 = mean(0, 1, 3)."""
    x = np.array([[0.0], [1.0], [3.0], [10.0], [11.0]])
    want = np.array([4 / 3, 4 / 3, 4 / 3, 8.0, 8.0])
    close(byz.pre.NNM(2)(x.copy())[:, 0], want, rtol=1e-15)
    close(fs_pre("nnm", x, 2)[:, 0], want, rtol=1e-15)


@pytest.mark.parametrize("n,f,kind,seed", CASES, ids=CASE_IDS)
def test_clipping_same_definition(byz, n, f, kind, seed):
    x = _data(kind, n, seed)
    c = float(np.median(np.linalg.norm(x, axis=1)))
    close(fs_pre("clipping", x, f, c=c), byz.pre.Clipping(c)(x.copy()))


def test_clipping_convention_default_c(byz):
    """ByzFL's Clipping defaults to c = 2.0; fedsafe's clipping has no default (c is required)."""
    x = _data("gaussian", 5, 0)
    close(byz.pre.Clipping()(x.copy()), fs_pre("clipping", x, 0, c=2.0))
    with pytest.raises(Exception, match="needs parameter"):
        PREAGGREGATORS.get("clipping")


@pytest.mark.parametrize("n,f,kind,seed", CASES, ids=CASE_IDS)
def test_arc_same_definition(byz, n, f, kind, seed):
    x = _data(kind, n, seed)
    close(fs_pre("arc", x, f), byz.pre.ARC(f)(x.copy()))


def test_arc_convention_clipped_count(byz):
    """k = ⌊2 (f/n)(n − f)⌋ clipped to the (k+1)-th largest norm in both. ByzFL computes k in
    floating point (``int((2f/n)(n−f))``), fedsafe exactly (``2f(n−f) div n``); they agree for
    every n < 200, f < n/2 (checked here), so the rounding never bites in that range."""
    for n in range(1, 200):
        for f in range((n + 1) // 2):
            assert int((2 * f / n) * (n - f)) == (2 * f * (n - f)) // n
    x = np.arange(1.0, 11.0)[:, None]  # norms 1..10, f = 3: k = ⌊2·0.3·7⌋ = 4, τ = 6
    want = np.minimum(x, 6.0)
    close(byz.pre.ARC(3)(x.copy()), want, rtol=0)
    close(fs_pre("arc", x, 3), want, rtol=0)


@pytest.mark.parametrize("n,s", [(10, 2), (11, 3), (7, 1), (5, 5)])
def test_bucketing_same_definition_given_the_permutation(byz, n, s):
    """Bucketing is random in both, from different sources (ByzFL: numpy's global
    ``np.random.permutation``; fedsafe: ``torch.randperm`` on the round's generator), so the
    outputs cannot be made equal. Each is checked against the same definition (naive.bucketing:
    consecutive buckets of s in permuted order, a last partial bucket, ⌈n/s⌉ rows) with the
    permutation its own source draws; and, as multisets, both outputs average to the mean when
    s divides n."""
    x = _data("gaussian", n, 3)
    np.random.seed(11)
    perm_np = np.random.permutation(n).tolist()
    np.random.seed(11)
    theirs = byz.pre.Bucketing(s)(x.copy())
    close(theirs, naive.bucketing(x, perm_np, s), rtol=1e-12)
    gen = torch.Generator().manual_seed(5)
    perm_t = naive.bucketing_perm(torch.Generator().manual_seed(5), n)
    ours = PREAGGREGATORS.get("bucketing", {"s": s})(torch.from_numpy(x), f=1, generator=gen).numpy()
    close(ours, naive.bucketing(x, perm_t, s), rtol=1e-12)
    assert ours.shape == theirs.shape == (math.ceil(n / s), D)
    if n % s == 0:
        close(ours.mean(axis=0), theirs.mean(axis=0), rtol=1e-12)


def test_bucketing_convention_default_bucket_size(byz):
    """ByzFL's default s = 1 (a permutation of the inputs: no averaging); fedsafe's s = 2."""
    x = _data("gaussian", 6, 0)
    theirs = byz.pre.Bucketing()(x.copy())
    assert sorted(map(tuple, theirs)) == sorted(map(tuple, x))
    gen = torch.Generator().manual_seed(0)
    assert PREAGGREGATORS.get("bucketing")(torch.from_numpy(x), f=1, generator=gen).shape == (3, D)


# ----------------------------------------------------------------------------------- attacks


@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_sign_flip_same_definition(byz, kind):
    honest = _data(kind, 7, 2)
    theirs = byz.atk.SignFlipping()(honest.copy())
    ours = fs_attack("sign_flip", honest, 3)
    assert ours.shape == (3, D)
    for row in ours:
        close(row, theirs)
    close(theirs, -honest.mean(axis=0))


@pytest.mark.parametrize("tau", [2.0, 0.1, 100.0, -0.5])
def test_ipm_convention_parameterisation(byz, tau):
    """ByzFL's InnerProductManipulation(τ) sends −τ·mean; fedsafe's ipm(eps) sends −eps·mean
    and foe(tau) (1 − tau)·mean. Map: ByzFL τ = fedsafe eps = foe's tau − 1. Defaults differ:
    ByzFL τ = 2 (the sign flip's double), fedsafe eps = 0.1 (foe tau = 1.1), Xie et al.'s."""
    honest = _data("gaussian", 7, 4)
    theirs = byz.atk.InnerProductManipulation(tau)(honest.copy())
    close(fs_attack("ipm", honest, 2, eps=tau)[0], theirs)
    close(fs_attack("foe", honest, 2, tau=1.0 + tau)[1], theirs)


def test_ipm_convention_defaults(byz):
    honest = _data("gaussian", 7, 4)
    mean = honest.mean(axis=0)
    close(byz.atk.InnerProductManipulation()(honest.copy()), -2.0 * mean)
    close(fs_attack("ipm", honest, 1)[0], -0.1 * mean)
    close(fs_attack("foe", honest, 1)[0], -0.1 * mean)


@pytest.mark.parametrize("n_h", [2, 5, 12])
def test_alie_convention_sample_vs_population_std(byz, n_h):
    """ALIE sends mean + z·std. ByzFL's std is the sample one (ddof = 1), fedsafe's the
    population one (ddof = 0), so ByzFL's ALIE(τ) is fedsafe's alie(z = τ·√(n_h/(n_h − 1)))."""
    honest = _data("gaussian", n_h, 5)
    tau = 1.5
    theirs = byz.atk.ALittleIsEnough(tau)(honest.copy())
    close(fs_attack("alie", honest, 2, z=tau * math.sqrt(n_h / (n_h - 1)))[0], theirs)
    assert not np.allclose(fs_attack("alie", honest, 2, z=tau)[0], theirs)


def test_alie_convention_default_z(byz):
    """Default factor: ByzFL τ = 1.5 fixed; fedsafe z = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f
    (Baruch et al.'s Algorithm 3): n = 10, f = 3: s = 3, z = Φ⁻¹(0.7) ≈ 0.5244."""
    honest = _data("gaussian", 7, 5)
    z = alie_z(10, 3)
    assert z == pytest.approx(0.5244005, abs=1e-6)
    mean, std = honest.mean(axis=0), honest.std(axis=0)
    close(fs_attack("alie", honest, 3)[0], mean + z * std)
    close(byz.atk.ALittleIsEnough()(honest.copy()), mean + 1.5 * honest.std(axis=0, ddof=1))


def test_inf_convention_default_value(byz):
    """ByzFL's Inf sends +inf in every coordinate (float64); fedsafe's inf_nan does so with
    value="inf" (its default is "nan"; "-inf" too)."""
    honest = _data("gaussian", 5, 0)
    theirs = byz.atk.Inf()(honest.copy())
    assert theirs.dtype == np.float64 and np.all(np.isposinf(theirs))
    ours = fs_attack("inf_nan", honest, 2, value="inf")
    assert ours.shape == (2, D) and np.all(np.isposinf(ours))
    assert np.all(np.isnan(fs_attack("inf_nan", honest, 2)))


def test_gaussian_convention_statistics_and_defaults(byz):
    """Random in both, from different sources (numpy's global stream vs the round's torch
    generator): only the statistics are compared. Both draw i.i.d. N(μ, σ²) coordinates;
    ByzFL has μ (default 0) and σ (default 1) and sends one vector; fedsafe has std (default
    200), μ = 0, and each Byzantine client gets its own draw."""
    d = 200_000
    honest = np.zeros((3, d))
    np.random.seed(0)
    theirs = byz.atk.Gaussian(mu=0.0, sigma=3.0)(honest)
    ours = fs_attack("gaussian", honest, 2, std=3.0)
    for sample in (theirs, ours[0], ours[1]):
        assert abs(sample.mean()) < 5 * 3.0 / math.sqrt(d)
        assert sample.std() == pytest.approx(3.0, rel=0.01)
    assert not np.array_equal(ours[0], ours[1])
    assert byz.atk.Gaussian()(honest[:, :d // 10]).std() == pytest.approx(1.0, rel=0.02)
    assert fs_attack("gaussian", honest[:, :d // 10], 1)[0].std() == pytest.approx(200.0, rel=0.02)


def test_mimic_convention_target_choice(byz):
    """Both send a copy of one honest update. ByzFL copies the fixed index ε (default 0);
    fedsafe picks the target argmax_i ⟨x_i, z⟩, z the honest updates' direction of largest
    variance by a power step (Karimireddy et al.'s heuristic), remembered in ctx.state.
    Map: fedsafe's output is ByzFL's Mimic(ε = that target)."""
    honest = _data("gaussian", 8, 6)
    state: dict = {}
    ours = ATTACKS.get("mimic")(torch.from_numpy(honest), ctx=ctx_for(honest, 2, state=state)).numpy()
    target = state["target"]
    assert target == int(np.argmax(honest @ state["z"].numpy()))
    close(ours[0], byz.atk.Mimic(epsilon=target)(honest.copy()), rtol=0)
    close(ours[1], ours[0], rtol=0)
    close(byz.atk.Mimic()(honest.copy()), honest[0], rtol=0)
