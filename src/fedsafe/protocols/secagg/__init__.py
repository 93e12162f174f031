"""Secure aggregation: Bonawitz et al. (CCS 2017), semi-honest or against a malicious server,
and SecAgg+ (Bell et al. 2020) with a random k-regular neighbour graph — real parties
exchanging bytes.

Modules: ``config`` (parameters, threshold, k, capacity), ``fixedpoint`` (Z_{2^bits} encoding
with a range per run of coordinates, and the clipping statistics), ``ranges`` (ranges from the
DP clip norm and noise with a tail bound on clipping),
``shamir`` (secret sharing), ``crypto`` (X25519/HKDF, AES-GCM, AES-CTR masks, Ed25519), ``pki``
(the simulated PKI and what is signed), ``graph``, ``wire`` (message format), ``transport``,
``client`` / ``server`` (the parties), ``session`` (one round in process), ``protocol`` (the
engine's ``secagg`` protocol).

Threat model
------------
One server and the round's clients; each client talks only to the server, over a channel that
authenticates the client (as TLS would), so everything a client learns about its peers is
relayed by the server. ``t`` is the Shamir threshold and ``g`` a client's share group (itself
and its neighbours: ``g = n`` for the complete graph, ``k + 1`` for SecAgg+).

Checked by every client in both variants, so that a server lying in what it announces or asks
for gains nothing: the announced ``t`` must satisfy ``g/2 < t <= g`` for the client's own group
(else it aborts, naming ``threshold``); it answers one unmask request per round, reveals one
kind of share per peer (a seed share or a mask-key share, never both) and never its own mask
key. Hence, whatever survivor lists the server sends to whom, two disjoint sets of ``t`` honest
holders do not exist and no client's mask key and self-mask seed are both rebuilt from its
holders' shares. A client advertising a
small-order X25519 key is left out of the round by the server (clients also refuse such keys).

``adversary = "semi_honest"`` (default): the server follows the protocol and tries to learn
inputs from what it sees, possibly with fewer than ``t`` clients of a group. It learns the sum
of the inputs of U3 (at least ``t`` clients) and nothing else. Nothing authenticates the keys it
relays: a server that substitutes its own keys for a client's neighbours reads that client's
input (tested) — use ``"active"`` against a server that may deviate.

``adversary = "active"`` (Bonawitz et al. §4, Fig. 4 with signatures and the consistency check):
the server may drop, delay, inject, replay or reorder messages, show different clients
different views, announce any parameters and lie about who takes part, who survived and who
dropped. Added:

* a PKI, simulated: a trusted directory of Ed25519 verification keys made at enrolment, outside
  the server's control (``pki.Enrolment``). Clients sign their per-round key pair (bound to the
  session, round and their id); every client verifies each relayed key pair against the
  directory before using it and aborts on a missing or invalid signature, so the server can
  neither substitute keys nor invent clients: Sybils are bounded by the enrolled identities.
* the consistency check after masked-input collection: the server sends U3; a client checks it
  is in U3 and ``|U3| >= t``, signs (session, round, U3) and returns the signature; the server
  forwards the signatures; a client releases shares only if at least ``t`` of them, each by a
  distinct member of U3, are valid over its own U3 (else it aborts, naming the field), and then
  reveals seed shares for the held clients in U3 and mask-key shares for the others — lists
  derived from the signed U3, not chosen by the server.

With ``c`` clients colluding with the server (revealing both shares, signing anything), no
honest client's two secrets are both rebuilt while ``2 t > g + c``, and (complete graph) no two
different survivor lists both gather ``t`` signatures while ``2 t > n + c``, so every honest
client that releases shares does so for one U3 and the server learns at most the sum over U3.
Bonawitz et al. take ``c < n/3`` and ``t > 2n/3``: ``threshold = 0.67``; the default ``0.5``
assumes no colluding clients.

Out of scope: the server still chooses who takes part and which honest clients to exclude
(down to ``t`` survivors) and, in SecAgg+, the neighbour graph, which clients cannot verify
(Bell et al.'s malicious variant derives it from verifiable randomness; not implemented); in
SecAgg+ ``t`` is per group, so ``t`` signatures do not pin one global U3 (per-client safety
still rests on ``2 t > g + c``); the server can always abort a round or output a wrong sum (no
integrity); malicious clients may send any input (robustness needs individual updates, which
secure aggregation hides); enrolment itself is trusted; timing and traffic analysis; the
encoding ranges, which the server announces and the clients do not check against their own DP
parameters (a server that narrows them clips the clients' distributed noise).
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "InMemoryTransport": "transport",
    "RoundOutcome": "session",
    "STAGES": "config",
    "SecAggConfig": "config",
    "SecAggError": "errors",
    "SecAggProtocol": "protocol",
    "Transport": "transport",
    "default_k": "config",
    "run_round": "session",
    "seeded_randomness": "session",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
