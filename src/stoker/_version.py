"""stoker's version, in a module of its own: what a cluster node compares with its trainer's
(``workers/actor.py``) is read from here, not from the package face, which would load the
``Loader`` into every worker."""

__version__ = "0.1.0"
