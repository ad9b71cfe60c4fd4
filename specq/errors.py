"""User and environment faults, shared by every layer.

Internal invariants use assertions; anything a user can cause (a bad file, a bad
parameter) raises one of these with a message that names the offending value.
The CLI turns them into one-line errors.
"""


class SpecqError(Exception):
    """Base class for faults a user or the environment can cause."""


class ModelFileError(SpecqError):
    """A model or heads file is missing, corrupt, or of an unsupported kind."""


class ParameterError(SpecqError):
    """A generation parameter is out of range."""


class InputError(SpecqError):
    """A prompt or input file is malformed."""
