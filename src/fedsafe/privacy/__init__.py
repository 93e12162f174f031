"""Privacy: what the released model reveals. Client-level differential privacy (the ``dp``
package: ``mechanisms`` — clipping, noise placements, adaptive clipping; ``accounting`` — ε over
dp-accounting's DpEvents; ``config`` — the ``[dp]`` section; ``plugin`` — DP-FedAvg in the
round) and the inherent privacy of noisy training (``inherent``).

How updates travel and are aggregated without being seen (secure aggregation, HE, the TEE, and
the crypto they share) lives in :mod:`fedsafe.protocols`. Their old paths here
(``fedsafe.privacy.secagg``, ``.he``, ``.tee``, ``.crypto`` and every module under them) still
import, for one release: each gives the very module of its new path, with a
``DeprecationWarning`` (:func:`fedsafe.core.lazy.moved_modules`)."""

from fedsafe.core.lazy import moved_modules

# Old submodule -> its new home; the submodules of a moved package follow it.
_MOVED = {
    "secagg": "fedsafe.protocols.secagg",
    "he": "fedsafe.protocols.he",
    "tee": "fedsafe.protocols.tee",
    "crypto": "fedsafe.protocols.crypto",
}
__getattr__ = moved_modules(__name__, _MOVED)
