"""RL for tool-use agents: GRPO, Dr.GRPO, DAPO, ARPO and AEPO over multi-turn travel-planning rollouts.

The loop is `trainer.train`; docs/architecture.md places it in the pipeline."""
