"""Orchestration: presets, the DVC stage graph as data, GPU slots, DVC stage runs, and the `star preset/ui` commands.

The Prefect flows and their commands (`star run/sweep/deploy`) live in `flows/`, which builds on this package;
MLflow is reached only through `components.tracking`.
"""
