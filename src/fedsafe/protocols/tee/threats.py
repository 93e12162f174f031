"""What the TEE offload does *not* protect against, each with the attack as a function (the
tests run them against real protocol rounds).

1. **Colluding accelerators recover every update exactly.** ``(Y¹ + Y²)/2 = g`` (in exact
   mode bit-for-bit the enclave's fixed-point ``g_q``, within ``q/2 ≈ 1e-16·(clip + max|R|)``
   of ``g``). The privacy of the scheme rests entirely on the two accelerators not colluding
   — and on the host not wiring both channels to itself (a man-in-the-middle host *is* a
   colluding pair: the enclave does not authenticate accelerators). :func:`collude`.

2. **A client colluding with an accelerator learns a projection of every other update.** A
   Byzantine client ``b`` knows its own ``g_b``; with accelerator 1's ``Y¹_b`` it gets
   ``R_b = Y¹_b − g_b``, and since the noise rows are *orthogonal*, for every other client
   ``⟨Y¹_i, R_b⟩ = ⟨g_i, R_b⟩ + ⟨R_i, R_b⟩ = ⟨g_i, R_b⟩`` exactly: one random projection of
   each honest update per colluding client (``f`` colluders: ``f`` projections). With
   i.i.d. Gaussian noise the term ``⟨R_i, R_b⟩ ~ C/(2√d)`` would mask it; the orthogonality
   that makes decoding free is what exposes it. :func:`client_accelerator_projection`.

3. **Fixed-norm noise reveals one scalar per update.** ``‖R_i‖² = C/2`` exactly and ``C``
   follows from the public configuration (``C = 2ρ clip²``), so one accelerator alone knows
   ``‖Y_i − g_i‖² = C/2``, i.e. ``⟨g_i, Y_i⟩ = (‖Y_i‖² − C/2 + ‖g_i‖²)/2``; since
   ``‖g_i‖² ≤ clip² ≪ C``, that pins ``⟨g_i, Y_i/‖Y_i‖⟩`` to within ``clip²/(2‖Y_i‖)``. The
   paper's Gaussian-channel bound does not count this. :func:`norm_projection`.

4. **The mutual-information bound is per round and adds up.** ``mi_bound_bits`` is per
   client, per accelerator, per round; over T rounds the bound is T times as large
   (``mi_bound_bits_total``), and it holds only for updates within ``clip`` (the enclave
   enforces it by clipping, counted in ``clipped``).

5. **Simulated trust roots.** Attestation and sealing are software stand-ins (``attestation``):
   a malicious host that created the platform can forge quotes and unseal noise.

6. **Noise reuse would leak differences.** ``Y_t − Y_t' = g_t − g_t'`` if a block were used
   twice; the pool hands out each block once, sealed blocks are bound to their sequence number,
   and the enclave refuses to encode a round number it has already passed (so replayed client
   ciphertexts cannot be re-encoded with fresh noise and averaged).

7. **Predictable noise would leak everything.** ``Y ≈ R`` when ρ ≫ 1, so noise from a seeded or
   statistical generator could be regenerated; the enclave draws it from AES-CTR keyed by
   ``os.urandom``.

8. **Integrity is not the paper's threat model.** A malicious accelerator could return a wrong
   Gram matrix; the enclave checks the decoded norms against the updates' own (O(nd)), which
   catches errors on the diagonal, not a consistent lie about off-diagonal entries.
"""

from __future__ import annotations

import torch
from torch import Tensor


def collude(y1: Tensor, y2: Tensor) -> Tensor:
    """Both accelerators together: ``(Y¹ + Y²)/2 = g`` (exact in binary floating point)."""
    return (y1 + y2) / 2


def client_accelerator_projection(y_acc: Tensor, b: int, g_b: Tensor) -> tuple[Tensor, Tensor]:
    """Client ``b`` (knowing ``g_b``) with one accelerator's ``Y``: returns ``(R_b, p)`` with
    ``p_i = ⟨Y_i, R_b⟩ = ⟨g_i, R_b⟩`` for every client ``i ≠ b``."""
    r_b = y_acc[b] - g_b.to(y_acc.dtype)
    return r_b, y_acc @ r_b


def norm_projection(y: Tensor, c: float) -> Tensor:
    """One accelerator alone, knowing ``C``: the estimate ``(‖Y_i‖² − C/2)/(2‖Y_i‖)`` of
    ``⟨g_i, Y_i/‖Y_i‖⟩`` (off by ``‖g_i‖²/(2‖Y_i‖)``)."""
    norms = torch.linalg.vector_norm(y, dim=1)
    return (norms**2 - c / 2) / (2 * norms)
