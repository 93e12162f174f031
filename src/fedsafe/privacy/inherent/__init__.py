"""When does secure aggregation alone give DP? Zhang, Ezzeldin, Elkordy, Psounis, Avestimehr,
"Differentially Private Federated Learning without Noise Addition: When is it Possible?".

Setting: FedSGD under ideal secure aggregation, where the server sees only ``Σ_i x_i``. Each user
``i`` holds ``D`` records with clipped per-example gradients ``g_{i,j}`` (``||g|| ≤ C``) and
sends ``x_i = G_i w_i`` (Eq. 12) for sampling weights ``w_i``. The paper's answers, as code:

- Theorem 1 (:func:`span_check`): a record whose gradient leaves the span of the round's
  gradients is exposed, so IID minibatch sampling and deterministic GD give no DP without noise.
- Theorems 2–3 (:func:`rdp_theorem2`, :func:`rdp_theorem3`): with Gaussian sampling (GSGD,
  ``w ~ N(1/D, I/(BD))``) and a non-singular covariance, ε ≈ 1/Λ with ``Λ = Σ_i λ_{i,min}``.
- WF-NA (:func:`wf_na_plan`): lift the covariance's eigenvalues below σ² to σ²; Theorem 4
  (:func:`rdp_theorem4`). Table 1 rows: :func:`rdp_table1`, :func:`dp_table1_closed_form`.
- The auditor (:func:`audit_round` → :class:`RoundAudit`) and the counterexample
  (:func:`counterexample_four_users`).

Modules: ``gradients`` (per-example grads via ``torch.func``), ``mechanisms`` (sgd_iid, gd,
gsgd, client_update), ``waterfilling`` (exact and block WF-NA), ``spectral`` (Gram-trick and
Lanczos spectra, span checks), ``bounds`` (per-round RDP, and the readings chosen where the paper
is inconsistent), ``composition`` (RDP sums, KOV, conversions, σ² calibration), ``audit``,
``counterexample``.
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "DEFAULT_ALPHAS": "composition",
    "DEFAULT_RTOL": "spectral",
    "MECHANISMS": "mechanisms",
    "NOISES": "mechanisms",
    "RoundAudit": "auditor",
    "Spectrum": "spectral",
    "TABLE1_ROWS": "bounds",
    "WaterFillingPlan": "waterfilling",
    "aggregate_spectrum": "spectral",
    "audit_round": "auditor",
    "calibrate_sigma2": "composition",
    "client_update": "mechanisms",
    "clip_rows": "gradients",
    "compose_rdp": "composition",
    "counterexample_four_users": "counterexample",
    "covariance_spectrum": "spectral",
    "cumulative_epsilon": "composition",
    "dp_table1_closed_form": "bounds",
    "epsilon_schedule": "composition",
    "gd": "mechanisms",
    "gsgd": "mechanisms",
    "kov_compose": "composition",
    "kov_optimal_delta": "composition",
    "kov_optimal_epsilon": "composition",
    "per_example_grads": "gradients",
    "rdp_sgd_iid_isotropic_amplified": "bounds",
    "rdp_table1": "bounds",
    "rdp_theorem2": "bounds",
    "rdp_theorem3": "bounds",
    "rdp_theorem4": "bounds",
    "rdp_to_dp": "composition",
    "sgd_iid": "mechanisms",
    "span_basis": "spectral",
    "span_check": "spectral",
    "subspace_lambda_min": "spectral",
    "symmetric_lambda": "bounds",
    "wf_na_noise": "waterfilling",
    "wf_na_plan": "waterfilling",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
