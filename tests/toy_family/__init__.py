"""A model family bertlab does not have, kept outside the package: the toy-family test registers it with one line."""
