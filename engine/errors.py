"""Errors the engine raises on bad input: each carries a machine-readable code for the protocol
and a message that names the problem and what to do about it."""


class EngineError(Exception):
    code = "engine_error"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class CheckpointError(EngineError):
    """A model directory that cannot be loaded: missing, truncated or inconsistent files."""
    code = "bad_checkpoint"


class PairMismatchError(EngineError):
    """A drafter that was not made for this target (sizes, vocabulary or layers disagree)."""
    code = "pair_mismatch"


class PromptTooLongError(EngineError):
    code = "prompt_too_long"


class Cancelled(EngineError):
    """A request stopped on the user's cancel before it finished (a load between its stages)."""
    code = "cancelled"


class SettingsError(EngineError):
    """Generation settings outside their valid range."""
    code = "bad_settings"
