"""fedsafe's foundation layer: the small, dependency-light pieces every other package stands on.

Nothing in :mod:`fedsafe.core` imports a higher layer (engine, subsystems, command line), so
importing it is cheap and cannot create an import cycle.
"""
