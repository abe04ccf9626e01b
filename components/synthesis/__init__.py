"""Synthesis: query sampling, budgets, feasibility and text; the programmatic expert and the endpoint teacher;
trajectory filtering into SFT records."""
