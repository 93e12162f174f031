"""Errors a user can act on, each carrying one line per problem.

The command line prints ``error: <line>`` for each problem and exits with status 2, never a
traceback. Every line names where the problem is (a config key, a file, a command-line
option) and, where it can, what would be valid.

One hierarchy: every error fedsafe raises to refuse something (a config, a file, a round, a
rule's (n, f), a tampered message) is a :class:`FedsafeError`, so ``except fedsafe.FedsafeError``
catches them all; each keeps its built-in base too (most are a ``ValueError``), so code that
catches that still works. The subsystems define their own subclasses next to the code that
raises them (``fedsafe.data.errors``, ``fedsafe.protocols.secagg.errors``, ...).
"""

from __future__ import annotations


class FedsafeError(Exception):
    """A problem the user can fix; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class ConfigError(FedsafeError, ValueError):
    """A config that cannot run (found before any output is written)."""


class RunDirError(FedsafeError, OSError):
    """The output folder cannot be used: not a fedsafe run, not writable, disk full."""


class CheckpointError(FedsafeError, ValueError):
    """A checkpoint that cannot be resumed from: unreadable, tampered with, or another run's."""


class DivergedError(FedsafeError):
    """The model stopped being finite: a server step turned a finite direction into infinite or
    NaN parameters (a learning rate too large for the updates). The run stops at that round,
    with the state from before the step; lower ``server.lr`` (or ``clients.lr``)."""


class RequirementError(FedsafeError, ValueError):
    """A robust rule's requirement on (n, f) does not hold for this round's participants.

    Under Poisson sampling the number of participants varies, so such a round is skipped (and
    recorded) rather than aborting the run; any other error is a bug and propagates.
    """


class ProtocolError(FedsafeError, ValueError):
    """An impossible protocol / rule combination, or a round the protocol cannot complete
    (e.g. too few secure-aggregation survivors): the round is skipped with the reason."""
