"""The ClientApp: each SuperNode is one fedsafe client (its partition-id)."""

from fedsafe.flower import client_app

app = client_app()
