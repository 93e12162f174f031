"""The synthetic(α, β) federated dataset of Li et al. (FedProx, MLSys 2020), Section 5.1.

For each client k (variances, not standard deviations, as in the paper):

    u_k ~ N(0, α),  B_k ~ N(0, β)
    W_k ∈ R^{C×d}, (W_k)_ij ~ N(u_k, 1);   b_k ∈ R^C, (b_k)_i ~ N(u_k, 1)
    v_k ∈ R^d,     (v_k)_j ~ N(B_k, 1)
    x ~ N(v_k, Σ),  Σ = diag(j^{-1.2}), j = 1..d
    y = argmax_c softmax(W_k x + b_k)_c = argmax_c (W_k x + b_k)_c

β moves each client's inputs (v_k) and so its label mix; α moves each client's model. Note a
property of this exact model that the paper does not state: u_k shifts every logit by the same
amount u_k·(1ᵀx + 1), so it never changes the argmax. With the same standard-normal draws the
labels are identical for every α; only β (and the per-client randomness of W_k, b_k, v_k that
exists at any α, β) makes clients heterogeneous.

Sample sizes (the paper: "follow a power law"; its code draws lognormal(4, 2) + 50). Here, with
m = ``mean_samples`` and σ = :data:`SIZE_SIGMA` = 1:

    n_k = max(2, round(m · exp(σ Z_k − σ²/2))),  Z_k ~ N(0, 1)

so before rounding E[n_k] = m exactly (median m·e^{−1/2} ≈ 0.61 m), the log-sizes are normal
with standard deviation σ, and every client has at least 2 samples (one for training, one for
testing).

Client k draws everything from its own stream ``numpy_stream(seed, "data.synthetic", k)``, so
client k's data is the same whatever the number of clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsafe.core.streams import numpy_stream

SIZE_SIGMA = 1.0
MIN_SAMPLES = 2
COV_EXPONENT = -1.2


@dataclass(frozen=True)
class SyntheticClients:
    """All clients' samples plus the generating parameters (for tests and diagnostics)."""

    x: np.ndarray  # float32 (N, d), clients concatenated in id order
    y: np.ndarray  # int64 (N,)
    client: np.ndarray  # int64 (N,): the generator client of each sample
    sizes: np.ndarray  # int64 (K,)
    u: np.ndarray  # (K,)  model means
    B: np.ndarray  # (K,)  input-mean means
    W: np.ndarray  # (K, C, d)
    b: np.ndarray  # (K, C)
    v: np.ndarray  # (K, d) input means

    def indices(self) -> list[np.ndarray]:
        """Per-client int64 indices into ``x`` (contiguous ranges, in client order)."""
        ends = np.cumsum(self.sizes)
        return [np.arange(e - n, e, dtype=np.int64) for n, e in zip(self.sizes, ends, strict=True)]


def covariance_diagonal(dim: int) -> np.ndarray:
    """Σ_jj = j^{-1.2} for j = 1..dim."""
    return np.arange(1, dim + 1, dtype=np.float64) ** COV_EXPONENT


def sample_size(rng: np.random.Generator, mean_samples: int) -> int:
    """One draw of n = max(2, round(m · exp(σZ − σ²/2))), Z ~ N(0, 1), σ = SIZE_SIGMA."""
    z = rng.standard_normal()
    return max(MIN_SAMPLES, int(round(mean_samples * np.exp(SIZE_SIGMA * z - SIZE_SIGMA**2 / 2))))


def generate_synthetic(
    num_clients: int,
    seed: int,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    dim: int = 60,
    num_classes: int = 10,
    mean_samples: int = 100,
) -> SyntheticClients:
    """Draw ``num_clients`` clients of synthetic(α=alpha, β=beta); see the module docstring."""
    for field, value, low in (("num_clients", num_clients, 1), ("dim", dim, 1),
                              ("num_classes", num_classes, 2), ("mean_samples", mean_samples, MIN_SAMPLES)):
        if int(value) != value or value < low:
            raise ValueError(f"synthetic: {field} must be an int >= {low}, got {value!r}")
    for field, value in (("alpha", alpha), ("beta", beta)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"synthetic: {field} (a variance) must be finite and >= 0, got {value}")
    sd = np.sqrt(covariance_diagonal(dim))
    xs, ys, sizes = [], [], []
    us, Bs, Ws, bs, vs = [], [], [], [], []
    for k in range(num_clients):
        rng = numpy_stream(seed, "data.synthetic", k)
        u = np.sqrt(alpha) * rng.standard_normal()
        B = np.sqrt(beta) * rng.standard_normal()
        n = sample_size(rng, mean_samples)
        W = u + rng.standard_normal((num_classes, dim))
        b = u + rng.standard_normal(num_classes)
        v = B + rng.standard_normal(dim)
        x = v + sd * rng.standard_normal((n, dim))
        y = np.argmax(x @ W.T + b, axis=1)
        xs.append(x)
        ys.append(y)
        sizes.append(n)
        us.append(u)
        Bs.append(B)
        Ws.append(W)
        bs.append(b)
        vs.append(v)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    return SyntheticClients(
        x=np.concatenate(xs).astype(np.float32),
        y=np.concatenate(ys).astype(np.int64),
        client=np.repeat(np.arange(num_clients, dtype=np.int64), sizes_arr),
        sizes=sizes_arr,
        u=np.asarray(us),
        B=np.asarray(Bs),
        W=np.stack(Ws),
        b=np.stack(bs),
        v=np.stack(vs),
    )
