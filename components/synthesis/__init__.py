"""Synthesis: the trajectories stage (the teacher through the agent loop), trajectory filtering into SFT records,
and SFT records from any environment's expert. Environments are reached through `components.environments` only."""
