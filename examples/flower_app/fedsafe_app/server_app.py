"""The ServerApp: fedsafe's engine, with the SuperNodes as its clients."""

from pathlib import Path

from fedsafe.flower import server_app

app = server_app(app_dir=Path(__file__).parent)
