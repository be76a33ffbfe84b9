"""Configs that spread a run over devices, processes and machines (see ../__init__.py)."""
