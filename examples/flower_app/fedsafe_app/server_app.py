"""The ServerApp: fedsafe's engine, with the SuperNodes as its clients.

Your own model: name its factory in experiment.toml (``[model] name = "your_package.models:Net"``,
``Net(cfg, input_shape, num_classes)``; installed on the server and on every node), or pass the
module here and in client_app.py: ``server_app(app_dir=..., model=Net(...), loss=...)``. Your own
data: ``fedsafe.register_dataset("name", ...)`` in a module both apps import, and
``[data] name = "name"``.
"""

from pathlib import Path

from fedsafe.flower import server_app

app = server_app(app_dir=Path(__file__).parent)
