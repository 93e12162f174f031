"""Privacy accounting for DP-FedAvg over dp-accounting's DpEvents (no accountant is
re-implemented here): ε of a run, noise calibration, and a round-by-round ``Accountant`` the
engine checkpoints.

Vocabulary (docs/architecture.md): noise multiplier ``z`` = noise std / clip norm C, sampling probability
``q``, rounds ``T``, ``delta``. One round of DP-FedAvg is one Gaussian release of the sum of
client updates clipped to C (``fedsafe.privacy.dp.mechanisms``); with adaptive clipping the round is still
one Gaussian release with the *total* z (Andrew et al. 2021, Thm 1; ``dp.adaptive_clip_split``),
so it is composed exactly like a fixed-clip round. A round maps to a DpEvent
(:func:`gaussian_round_event`) by the client-sampling scheme:

=========== ================================================== =========================
sampling    DpEvent (one round)                                 fedsafe ``clients.sampling``
=========== ================================================== =========================
``poisson`` ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``        ``poisson`` (q = sample_rate)
``fixed``   ``SampledWithoutReplacementDpEvent(N, m, Gaussian(z))``  ``fixed`` (m = sample_size)
``none``    ``GaussianDpEvent(z)`` (no amplification claimed)       ``all``
=========== ================================================== =========================

``z = 0`` is ``NonPrivateDpEvent`` (ε = ∞). T rounds are ``SelfComposedDpEvent(event, T)``;
heterogeneous rounds (different z or q) are a ``ComposedDpEvent`` of such groups.

What dp-accounting 0.6 supports for these events, by accountant and neighbouring relation
(checked with ``PrivacyAccountant.supports``; ✓ supported, ✗ refused by dp-accounting)::

    event                           accountant  ADD_OR_REMOVE_ONE  REPLACE_ONE  REPLACE_SPECIAL
    GaussianDpEvent                 RDP         ✓                  ✓ (*)        ✓
                                    PLD         ✓                  ✓            ✓
    PoissonSampledDpEvent(Gauss.)   RDP         ✓                  ✗            ✓
                                    PLD         ✓                  ✓            ✓
    SampledWithoutReplacement(G.)   RDP         ✗                  ✓ (*)        ✗
                                    PLD         ✗                  ✗            ✗

What fedsafe offers and refuses:

- Relations: ``add_or_remove_one`` (default for ``poisson`` and ``none``: a client takes part or
  not) and ``replace_one`` (default for ``fixed``: a fixed-size sample of a population of known
  size N only makes sense when N is public). ``REPLACE_SPECIAL`` is not offered: for these
  Gaussian events it gives the same numbers as add/remove.
- ``fixed`` needs ``accountant="rdp"`` with ``replace_one``; ``fixed`` with PLD, and ``fixed``
  under add/remove, are refused. ``poisson`` with ``rdp`` under ``replace_one`` is refused
  (``pld`` supports it). Errors name the accountant and relation and the combination that works.
- (*) Sensitivity under replace-one. GaussianDpEvent's z is defined as s/C for values with
  ‖v_i‖ ≤ C (dp-accounting's own docstring, and fedsafe's z). Replacing a client can move the
  sum by 2C. dp-accounting's PLD accountant accounts for that (its REPLACE adjacency shifts by
  ±C), but its RDP accountant treats z as std / L2-sensitivity, so under REPLACE_ONE it would
  understate the RDP by 4× (google/differential-privacy issue #378). fedsafe keeps the events in
  the documented s/C convention and, when composing into an RDP accountant under
  ``replace_one``, passes z/2 to the Gaussian inside — only if the installed dp-accounting shows
  that behaviour (probed once, :func:`_rdp_replace_one_halves`), so a fixed release is not
  corrected twice.

Accountants:

- ``rdp``: ``RdpAccountant(RDP_ORDERS, relation)``; ε from the RDP curve at :data:`RDP_ORDERS`
  with dp-accounting's conversion (Canonne–Kamath–Steinke / Asoodeh et al., tighter than
  Mironov's ε = RDP(α) + log(1/δ)/(α−1)). The orders are dense where the optimum sits for
  practical (z, q, T): 1.1…1.4 by 0.1, 1.5…3 by 0.05, 3.1…11 by 0.1, 12…64, then 72…1024.
  RDP is an upper bound, usually looser than PLD.
- ``pld``: dp-accounting's privacy loss distributions with the pessimistic (connect-the-dots)
  discretization, so ε is an upper bound at every interval; a coarse interval overstates it
  (at q = 2.2e-4, z = 1.625, T = 26,104, δ = 1e-5 the old fixed 1e-3 gave 0.170 against a
  converged 0.0726). The interval is therefore chosen per call (:func:`pld_epsilon`): start at
  h₀ = 0.05·ε_RDP/√T on the ladder 1e-2·2^-k (ε_RDP, the RDP bound, is a cheap estimate; the
  scale was fitted so h₀ is usually already converged), halve h until two successive values
  agree within 0.5 % (:data:`PLD_REFINE_TOL`), and report the finer one. The error of the
  pessimistic estimate shrinks at least linearly in h in every case measured, so the reported ε
  is then within ~0.5 % of the converged value (the tests check 1 % against dp-accounting at a
  much finer interval). Each distinct round's one-round PLD is built once per interval and
  cached per process. Pass ``value_discretization_interval`` to fix the interval instead.

  Incremental composition (a run's accountant). Recomposing the whole history at every
  evaluation made accounting most of a run (a 1,000-round run evaluated every round: 18.5 of
  24 s). An :class:`Accountant` with a fixed interval therefore keeps the running
  ``PrivacyLossDistribution`` and composes onto it only the rounds added since the last ε, so ε
  after a new round costs one composition and one ε query. The engine fixes the interval
  before round 1 (:func:`planned_interval`: the one the refinement above settles on for the
  planned run, so the last round's ε is what :func:`epsilon` reports for the whole run). Each
  composition is dp-accounting's FFT convolution with its pessimistic tail truncation
  (:func:`compose_pld`, vectorised, both directions in one batched transform), so the running
  PLD is at every round what a ``PLDAccountant`` composing the same events at that interval
  holds, up to FFT rounding: an upper bound, like it.
  A checkpoint stores the records and the composition steps, and a resumed run replays the steps
  once: the same ε, bit for bit.

  Two guards keep PLD affordable: when the RDP bound already exceeds
  :data:`PLD_EPSILON_LIMIT` (10,000: no meaningful guarantee, and tiny z makes PLD's support, and
  its memory, explode — z = 0.01, q = 1, T = 1000 needed 4.4 GB and 2 minutes), PLD is not run
  and ε is the RDP bound (∞ where RDP cannot account the relation); and refinement stops before
  a one-round PLD would exceed :data:`PLD_MAX_POINTS` points (ε is then the last, still valid,
  upper bound). :meth:`Accountant.epsilon_details` says which happened.

Rounds are grouped by equal records whatever their order (composition commutes), so a run whose
per-round noise multiplier varies (distributed DP, ``fedsafe.privacy.dp.plugin``) costs one
PLD/RDP term per distinct multiplier, not per round. Such callers round each multiplier down to
the grid 2^(k/256) (:func:`grid_floor`): less noise is accounted than present (an upper bound on
ε, by ≤ 0.28 % in z), and the number of distinct records stays bounded.

Distributed DP has two observers (:class:`DistributedAccountant`). Each client adds a noise share
and secure aggregation sums them; in high dimension the sum's noise variance reveals how many
shares are in it, so ε depends on the realised count, and the count itself depends on whether
the target took part. Against the secure-aggregation server, which also sees who took part, a
client's rounds are Gaussian mechanisms with the realised noise and no amplification
(:func:`gaussian_epsilon`); against an outsider who sees the released model, amplification by
Poisson sampling holds for the mixture over the count (:func:`distributed_round_pld`). Reporting
the realised multipliers with amplification, as fedsafe did, bounded neither.

The package, split by concern (what happened is separate from how it is accounted):

- ``events``: the round events (:class:`GaussianRound`, :class:`DistributedRound`, their base
  :class:`RoundRecord`), frozen dataclasses of plain numbers that convert to dp-accounting
  DpEvents where one exists; :func:`make_round_record` validates them.
- ``engines``: the accountant registry :data:`ACCOUNTANT_ENGINES` and the engine interface
  (check an event, compose it, ε at δ, state_dict); ``rdp`` and ``pld`` register the two
  built-in engines, each with per-event-type handlers (``rdp.round_rdp``, ``pld.round_pld``,
  ``pld.pld_check``); ``distributed`` registers the distributed round's PLD handlers.
- ``accountant``: the :class:`Accountant` facade (grouped rounds, checkpoints; its engine looked
  up by name), :func:`planned_interval`, :func:`gaussian_epsilon` and
  :class:`DistributedAccountant`.
- ``calibrate``: one-shot :func:`epsilon`, :func:`calibrate_noise` and the reports of
  ``fedsafe privacy epsilon`` / ``calibrate``.
- ``common``: the vocabulary, checks and errors they share.

Every name is importable from ``fedsafe.privacy.dp.accounting`` as before the split. The code
looks each name up in the module that defines it: a spy on, e.g., ``compose_pld`` is set there
(``accounting.pld``).
"""

from __future__ import annotations

from . import accountant, calibrate, common, distributed, engines, events, pld, rdp
from .accountant import (
    Accountant,
    DistributedAccountant,
    gaussian_epsilon,
    planned_interval,
)
from .calibrate import (
    _calibrate_at,
    _one_shot,
    calibrate_noise,
    calibration_report,
    epsilon,
    epsilon_local,
    epsilon_table,
    format_calibration,
    format_epsilon_table,
)
from .common import (
    _Z_CEIL,
    _Z_FLOOR,
    CALIBRATION_TOL,
    CLIENT_SAMPLING,
    NEIGHBORING,
    NR,
    PLD_EPSILON_LIMIT,
    PLD_INTERVAL_SCALE,
    PLD_MAX_INTERVAL,
    PLD_MAX_POINTS,
    PLD_MAX_REFINEMENTS,
    PLD_PLANNED_TOL,
    PLD_REFINE_TOL,
    PLD_TAIL_MASS_TRUNCATION,
    RDP_ESTIMATE_ORDERS,
    RDP_ORDERS,
    SAMPLINGS,
    SHOWN_SAMPLING,
    Z_GRID_PER_OCTAVE,
    EpsilonDetails,
    PLDTooLargeError,
    UnsupportedAccountingError,
    _check_count,
    _check_delta,
    _check_interval,
    _check_neighboring,
    _check_q,
    _check_sampling,
    _check_z,
    _unsupported_message,
    natural_neighboring,
)
from .distributed import (
    _MIXTURE_SHIFT,
    _MIXTURE_TAIL,
    _distributed_round_deltas,
    _distributed_round_min_add_loss,
    _distributed_weights,
    distributed_interval,
    distributed_round_pld,
)
from .engines import ACCOUNTANT_ENGINES, AccountingEngine, _check_accountant, engine_class
from .events import (
    DistributedRound,
    GaussianRound,
    RoundRecord,
    _record_order,
    _records_from_event,
    gaussian_round_event,
    grid_floor,
    make_round_record,
)
from .pld import (
    _EPSILON_CHUNK,
    _EPSILON_FIRST,
    _EPSILON_MARGIN,
    _SPECTRA,
    PLD,
    PartsCache,
    PldEngine,
    _compose_pmfs,
    _dense_pld,
    _one_round_pld,
    _one_round_points,
    _pld_epsilon_at,
    _pld_group,
    _pld_part,
    _pmf_delta,
    _pmf_epsilon,
    _running_sums,
    _tail_length,
    _tail_sums,
    _spectra,
    _truncate_tails,
    compose_pld,
    exact_gaussian_epsilon,
    first_interval,
    pld_epsilon,
    pld_epsilon_for_delta,
)
from .rdp import RdpEngine, _rdp_curve, _rdp_replace_one_event, _rdp_replace_one_halves

# The built-in accountants' names (``[dp] accountant``), sorted: "pld", "rdp".
ACCOUNTANTS: tuple[str, ...] = tuple(ACCOUNTANT_ENGINES.names())
