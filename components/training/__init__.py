"""Training stages: supervised fine-tuning (`sft.py`) and reinforcement learning (`rl/`)."""
