"""The project's exception types.

Every error a user can cause with bad input (a malformed config, a truncated checkpoint, a missing file)
is raised as a `BertlabError` whose message is one line naming the file, the field or key, and what was
expected. The command line prints that line and exits with status 2 instead of a traceback.
"""


class BertlabError(Exception):
    """Base class: a problem with the user's input, explained in one line."""


class ConfigError(BertlabError, ValueError):
    """A model or run configuration is missing a field, has a wrong type, or is inconsistent."""


class CheckpointError(BertlabError):
    """Weights could not be read, or do not fit the model they are loaded into."""
