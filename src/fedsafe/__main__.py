"""``python -m fedsafe`` is the ``fedsafe`` command."""

from fedsafe.cli import main

main()
