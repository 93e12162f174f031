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

from fedsafe.audit.analytic import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    calibrate_analytic_gaussian,
    gdp_delta,
    gdp_epsilon,
)
from fedsafe.audit.canaries import CanaryBank, CanaryTracker
from fedsafe.audit.distributions import CosineNull, Normal
from fedsafe.audit.estimators import (
    DEFAULT_ESTIMATOR,
    audit_summary,
    clopper_pearson_upper,
    empirical_lower_bound,
    equal_variance_epsilon,
    equal_variance_mu,
    held_out_lower_bound,
    jeffreys_upper,
    likelihood_ratio_epsilon,
    threshold_epsilon,
)
from fedsafe.audit.figures import histogram_figure, plot_histogram
from fedsafe.audit.gaussian import PAPER_TABLE1, format_table1, gaussian_table1
from fedsafe.audit.observer import AuditResult, CanaryAudit

__all__ = [
    "DEFAULT_ESTIMATOR",
    "PAPER_TABLE1",
    "AuditResult",
    "CanaryAudit",
    "CanaryBank",
    "CanaryTracker",
    "CosineNull",
    "Normal",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "audit_summary",
    "calibrate_analytic_gaussian",
    "clopper_pearson_upper",
    "empirical_lower_bound",
    "equal_variance_epsilon",
    "equal_variance_mu",
    "format_table1",
    "gaussian_table1",
    "gdp_delta",
    "gdp_epsilon",
    "held_out_lower_bound",
    "histogram_figure",
    "jeffreys_upper",
    "likelihood_ratio_epsilon",
    "plot_histogram",
    "threshold_epsilon",
]
