"""TEE-encoded robust aggregation (Hashemi, Wang, Guo, Annavaram, "Byzantine-robust and
privacy-preserving framework for FedML").

Clients encrypt their updates ``g_i`` to an attested enclave. The enclave adds noise vectors
``R_i`` with ``‖R_i − R_j‖² = C`` for all ``i ≠ j`` and sends ``Y¹ = g + R`` to accelerator 1 and
``Y² = g − R`` to accelerator 2; each computes the Gram matrix of what it received; the
enclave adds them, ``⟨Y¹_i,Y¹_j⟩ + ⟨Y²_i,Y²_j⟩ = 2⟨g_i,g_j⟩ + C·[i=j]``, decodes exact
distances, runs the distance-based rule and aggregates. Each accelerator learns at most
``(d/2) log₂(1 + 1/ρ)`` bits per round about an update (``ρ = σ²/Var``).

Modules, in the order data flows:

``client``       verify the quote, encrypt the update          (client)
``attestation``  simulated quote / measurement / sealing key   (simulation, not hardware)
``channel``      X25519 + HKDF + AES-GCM channels              (all parties)
``wire``         explicit byte formats, no pickle              (all parties)
``enclave``      decrypt, clip, encode, decode, select, aggregate
``noise``        equidistant noise, CSPRNG, precompute + sealed pool
``accelerator``  Gram matrices on encoded data (CUDA when present)
``numerics``     exact fixed-point/split-Gram arithmetic, error estimates, warnings
``rules``        krum, multi_krum, bulyan, norm_filter, cosine_filter on decoded D / G
                 (the selections of ``fedsafe.robust.krum`` and ``fedsafe.robust.filters``)
``leakage``      the mutual-information bound
``host``         processes, pipes, timeouts, session lifecycle
``config``       TEEConfig, the ``[tee]`` section (light: no enclave machinery)
``protocol``     TEEProtocol (the engine's ``protocol = "tee"``)
``threats``      what is not protected, with the attacks
"""

from __future__ import annotations

from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy), so
# importing the [tee] config does not load the enclave, its processes or its crypto.
_EXPORTS = {
    "AttestationError": "attestation", "SimulatedPlatform": "attestation", "measure": "attestation",
    "verify_quote": "attestation",
    "IntegrityError": "channel",
    "mi_bound_bits": "leakage", "noise_constant": "leakage", "noise_ratio_for_bits": "leakage",
    "noise_variance": "leakage",
    "TEEPrecisionWarning": "numerics", "estimated_relative_error": "numerics",
    "COST_KEYS": "protocol", "TEEConfig": "config", "TEEProtocol": "protocol",
    "tee_rules": "rules",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
