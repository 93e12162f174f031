"""fedsafe on Flower (``pip install 'fedsafe[flower]'``).

- :func:`server_app` / :func:`client_app`: a fedsafe experiment over Flower SuperNodes, run by
  fedsafe's engine (robust rules, attacks, DP and its accounting, audit canaries, secure
  aggregation with fedsafe's own cryptography, metrics rows and checkpoints).
- :class:`FedsafeStrategy`: a Flower ``Strategy`` to swap into your own Flower project in place
  of ``FedAvg``: fedsafe's pre-aggregators and robust rule, central DP with its accountant, and
  metrics rows, over whatever your ClientApp trains; :func:`dp_mod` adds local or distributed DP
  noise on your clients.
"""

from fedsafe.core.lazy import lazy_exports

__all__ = ["FedsafeStrategy", "FlowerError", "FlowerSecAgg", "client_app", "dp_mod", "run_over_flower", "server_app"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "FedsafeStrategy": "strategy",
    "FlowerError": "records",
    "FlowerSecAgg": "secagg",
    "client_app": "client",
    "dp_mod": "mods",
    "run_over_flower": "server",
    "server_app": "server",
})
