"""Errors a user can act on. The CLI prints any of these as one sentence and exits non-zero."""

from __future__ import annotations


class TilepilotError(Exception):
    """Base of every error whose message is written for the user (one sentence, says what to do)."""

    exit_code = 2


class ConfigError(TilepilotError, ValueError):
    """A config file is missing, unreadable, or lacks a required field."""


class ScopeError(TilepilotError, ValueError):
    """The model is well-formed but outside what tilepilot deploys, or its dimensions are inconsistent."""


class CheckpointError(TilepilotError, ValueError):
    """A weight file is missing, truncated, corrupt, pickle-only, or disagrees with the config."""


class TokenizerError(TilepilotError, ValueError):
    """tokenizer.json or the chat template cannot be used."""


class WorkspaceError(TilepilotError, ValueError):
    """A deployment workspace is missing, incomplete, or was written by an incompatible version."""


class InputError(TilepilotError, ValueError):
    """A run-time input is unusable, e.g. a prompt longer than the model's context."""
