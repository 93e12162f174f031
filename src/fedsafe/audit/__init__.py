"""One-shot empirical privacy estimation with random canary clients (Andrew et al. 2023).

- :mod:`~fedsafe.audit.canaries`: :class:`CanaryBank` (canaries regenerated from (seed, id),
  schedule of presentations) and :class:`CanaryTracker` (chunked final / max-over-rounds cosines).
- :mod:`~fedsafe.audit.observer`: :class:`CanaryAudit`, the three calls the engine makes.
- :mod:`~fedsafe.audit.estimators`: ε from cosines. The default is the equal-variance (μ-GDP)
  estimator; the paper's fitted-σ̂ estimate is reported beside it and is biased upward. The
  paper's ε_lo is an optimistic threshold-maximised statistic; ``held_out_lower_bound`` (a
  threshold chosen on half the canaries, Clopper–Pearson on the other half) is a valid 95% bound.
- :mod:`~fedsafe.audit.analytic`: the analytic Gaussian mechanism (Balle & Wang 2018).
- :mod:`~fedsafe.audit.gaussian`: Table 1, the one-shot audit of the Gaussian mechanism.
- :mod:`~fedsafe.audit.figures`: histogram of canary cosines against the null.
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "AuditResult": "observer",
    "CanaryAudit": "observer",
    "CanaryBank": "canaries",
    "CanaryTracker": "canaries",
    "CosineNull": "distributions",
    "DEFAULT_ESTIMATOR": "estimators",
    "Normal": "distributions",
    "PAPER_TABLE1": "gaussian",
    "analytic_gaussian_delta": "analytic",
    "analytic_gaussian_epsilon": "analytic",
    "audit_summary": "estimators",
    "calibrate_analytic_gaussian": "analytic",
    "clopper_pearson_upper": "estimators",
    "empirical_lower_bound": "estimators",
    "equal_variance_epsilon": "estimators",
    "equal_variance_mu": "estimators",
    "format_table1": "gaussian",
    "gaussian_table1": "gaussian",
    "gdp_delta": "analytic",
    "gdp_epsilon": "analytic",
    "held_out_lower_bound": "estimators",
    "histogram_figure": "figures",
    "jeffreys_upper": "estimators",
    "likelihood_ratio_epsilon": "estimators",
    "plot_histogram": "figures",
    "threshold_epsilon": "estimators",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
