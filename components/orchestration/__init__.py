"""Orchestration: presets, the DVC stage graph as data, GPU slots, and the `star run/deploy/ui/preset` commands.

The Prefect flows themselves live in `flows/`; MLflow is reached only through `components.tracking`.
"""
