"""The ClientApp: each SuperNode is one fedsafe client (its partition-id).

Flower starts this module afresh for every message, so keep it light: fedsafe imports torch and
loads the node's data only for a training message. A model or loss passed to ``server_app`` must
be passed here too: ``client_app(model=Net(...), loss=...)``.
"""

from fedsafe.flower import client_app

app = client_app()
