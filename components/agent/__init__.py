"""The one multi-turn agent loop shared by the teacher, RL rollouts and evaluation, and its policy backends."""
