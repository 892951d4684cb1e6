"""The Loader and what it owns: ``core`` (the ``Loader`` class: iteration, peek, state, close),
``starting`` (its start-up: workers settled and started at the first batch), ``views`` (its
``stats()`` report and its Keras, torch, JAX and tf.data views),
``options`` (its keyword arguments, each declared once in a frozen group with its default, type,
doc and check; ``optiondocs`` makes the signature, ``help()`` and the docs page from them),
``config`` (the checks, with the fix in each message, and the sized choices),
``wiring`` (the resolver: every option resolved once into the frozen ``Recipe``, which every
worker and node receives whole, and the ``RunSpec``),
``selection`` (Keras' ``validation_split``/``subset``/``class_names``), ``running`` (what a
started loader owns: the in-process filler or the worker pool and its prefetch engine),
``state`` (the saved position) and ``consumer`` (one consumer per loader, fork safety)."""

from .core import Loader

__all__ = ["Loader"]
