"""RL for tool-use agents: GRPO, Dr.GRPO, DAPO and ARPO over multi-turn travel-planning rollouts (TRAINING.md)."""
