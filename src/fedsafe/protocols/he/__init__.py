"""Homomorphic robust aggregation: SABLE's HTS (trimmed sum) and HMED (median) over BFV.

Choffrut, Guerraoui, Pinot, Sirdey, Stephan, Zuber, "SABLE: Secure And Byzantine robust
LEarning" (arXiv:2309.05395). Modules:

* :mod:`~fedsafe.protocols.he.encoding`   clamp/quantize (QUA) and mixed-radix digits
* :mod:`~fedsafe.protocols.he.polynomials` Lagrange Neg / Zero / Btw mod p, Paterson–Stockmeyer
* :mod:`~fedsafe.protocols.he.circuit`    comparison, rank with tie-breaking, Between, HTS/HMED
* :mod:`~fedsafe.protocols.he.ops`        emulator (numpy mod p) and trace (cost / noise) backends
* :mod:`~fedsafe.protocols.he.validity`   the digit check: which nodes encrypted out-of-range digits
* :mod:`~fedsafe.protocols.he.params`     parameter selection (128-bit security, noise budget)
* :mod:`~fedsafe.protocols.he.bfv`        TenSEAL/SEAL BFV backend: keys, nodes, server
* :mod:`~fedsafe.protocols.he.config`     ``HEConfig``, the ``[he]`` section
* :mod:`~fedsafe.protocols.he.protocol`   ``HEProtocol`` (``protocol = "he"``)

Encoding on TenSEAL's BFV
-------------------------
The paper packs a value's base-B digits into the coefficients of one HElib extension-field slot
and extracts them homomorphically. SEAL's BFV with a prime p = 1 mod 2N has N slots in Z_p
only, so each digit is its own *digit-plane* ciphertext (one per block of N coordinates), or a
value is one digit when the base covers 0..2^delta - 2. The planner picks the split by cost.

HMED and even n
---------------
HMED = HTS keeping ranks ``floor((n-1)/2) .. n-1-floor((n-1)/2)``: the middle value for odd n;
for even n the two middle values, whose sum the nodes halve -- the mean of the two middle
values, fedsafe's median convention. (The paper's ``f = floor(n/2)`` selects no rank at all
for even n.) With subsampling the server aggregates 2f+1 inputs, where HTS is HMED.

Threat model
------------
* **Nodes share one BFV key.** They generate it among themselves (here: one
  :class:`~fedsafe.protocols.he.bfv.NodeKeyring` stands for that setup) and give the server only
  :class:`~fedsafe.protocols.he.bfv.ServerKeys`: the public key and the relinearisation keys. No
  Galois keys exist (the circuit never rotates). Every node can decrypt the aggregate, and
  every node *could* decrypt any other node's upload if it saw it -- uploads go to the server
  only.
* **The server is honest-but-curious and does not collude with any node.** It follows the
  protocol and sees only ciphertexts, which under the decisional RLWE assumption (128-bit
  parameters, HomomorphicEncryption.org table, enforced by SEAL) reveal nothing about the
  values. A server that colluded with one node would learn every upload: the shared key is the
  price of a single-key, decrypt-anywhere scheme.
* **Byzantine nodes** (at most f, not colluding with the server) choose their message freely but
  run the encoding and encryption as specified (the paper's Remark 1): the encoder clamps, so
  every digit is in the circuit's range. Every node holds the key, though, so a node can
  bypass the encoder and encrypt out-of-range digits; the comparison polynomials are then
  meaningless on the coordinates it touches, and the decrypted trimmed sum there is an
  arbitrary residue mod p, up to (p-1)/(2*S*o) times the clamp (32,768x for n = 3, delta = 2).
  **Digit check** (``he.check_digits``, default on; :mod:`~fedsafe.protocols.he.validity`):
  before HTS the server evaluates, on each node's ciphertexts, ``sum r * V(c) + u`` with
  ``V(x) = prod_{v=0}^{D} (x - v)`` (0 exactly on the allowed digits), secret random
  multipliers r (so invalid coordinates cannot cancel: false accept <= 1/(p-1) per node and
  round) and a zero-sum mask u; a node decrypts and sums the slots -- 0 iff the upload is
  valid -- and the server runs HTS over the valid uploads only (the others count as dropouts,
  ``he_excluded_invalid``, ``Aggregate.included``). Revealed: one valid/invalid bit per node,
  to the nodes and the server; nothing about any value. Cost: depth about ceil(log2(D + 1))
  (2-3, against HTS's 4-10) and 2-30% of HTS's products for f > 0 (less as n grows). Second
  line of defence, and the only one with ``he.check_digits = false``: the nodes screen the
  decrypted sums: in-range uploads give a trimmed sum of S values in {-o..o}, so
  ``|sum| <= S*o`` (S = n - 2f for HTS, 1 or 2 for HMED; ``Quantizer.sum_bound``), and every
  coordinate beyond is set to 0 and counted (``he_out_of_range``). This guarantees every
  aggregate coordinate lies in [-C, C]; it does not catch corrupted comparisons whose result
  lands inside the bound (those coordinates can take any value in [-C, C], e.g. the opposite
  sign of every honest value), and it cannot name the node -- one such node makes the nodes
  zero almost every coordinate, a veto over the round, which the check removes. Neither
  stops a node that sends in-range but malicious values (that is the robust rule's job).
  Zero-knowledge range proofs on the ciphertexts would be the full fix. The server rejects, naming
  the node, uploads that are malformed at the ciphertext level: other parameters, wrong
  number of blocks or digit planes, wrong length, undecodable or transparent ciphertexts,
  non-fresh ciphertexts. Byte-identical copies of another upload are accepted and
  re-randomised (a replayed upload is just a Byzantine value).
* **What the server learns**: the parameters, n, the number of coordinates (hence the model
  size), ciphertext sizes, timing, which nodes failed the digit check, and -- with
  ``subsample`` -- which 2f+1 nodes it aggregated (it draws them itself, from a seeded public
  stream, among the valid uploads). Not the values, not the ranks, not which node was trimmed. The nodes learn the trimmed mean (the protocol's output), nothing
  else about other nodes' values beyond what it implies.
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "CircuitSpec": "circuit",
    "DigitCheck": "validity",
    "DigitPlan": "encoding",
    "DigitStrategy": "circuit",
    "HEConfig": "config",
    "HEParameterError": "params",
    "HEParams": "params",
    "HEPlan": "params",
    "HEProtocol": "protocol",
    "HEProtocolError": "protocol",
    "Quantizer": "encoding",
    "band": "params",
    "emulate_trimmed_sum": "emulator",
    "plan_hts": "params",
    "reference_trimmed_sum": "emulator",
    "trimmed_sum": "circuit",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
