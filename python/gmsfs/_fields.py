"""The key: value lines of gmsfs's text files (a store's state, a mount's device), for the
library's modules and gmsfsctl alike."""


def read_fields(path):
    """The key: value lines of a gmsfs text file (a store's state, a mount's device)."""
    with open(path) as f:
        return dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)
