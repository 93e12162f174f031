"""Protocols: how the clients' updates travel to the server and are aggregated without being
seen. Each is a :class:`fedsafe.core.protocol.SecureProtocol`, chosen by the config's
``protocol`` key (``plain``, the default, is :class:`fedsafe.core.protocol.PlainProtocol`):

* ``secagg`` — secure aggregation (Bonawitz et al. 2017, SecAgg+), the ``[secagg]`` section;
* ``he`` — SABLE's robust aggregation over BFV ciphertexts, the ``[he]`` section;
* ``tee`` — enclave-encoded robust aggregation offloaded to untrusted accelerators, the
  ``[tee]`` section;
* ``crypto`` — the X25519 / HKDF / AES-GCM / AES-CTR / Ed25519 primitives that ``secagg`` and
  ``tee`` share.

What the released model reveals (differential privacy, inherent noise) is
:mod:`fedsafe.privacy`; the empirical audit is :mod:`fedsafe.audit`. Until the release after
this one, the old paths ``fedsafe.privacy.secagg``, ``.he``, ``.tee`` and ``.crypto`` import
these modules, with a ``DeprecationWarning``."""
