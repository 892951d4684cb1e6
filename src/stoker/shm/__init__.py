"""Shared memory: segments, shared arrays, the folder choice, stale-segment cleanup, the
segment lock files and the reaper.

A leaf package: it imports only :mod:`stoker.errors`, the standard library and numpy, so
sources, the assembler and the workers can all use it without importing one another.
"""
