"""A fourth environment, `lookup`, written as docs/architecture.md's "add an environment" example: a code book the
agent reads with one tool (`lookup(name)`) to answer "What is the code of <name>?". Its package has the modules
every environment has; `test_fourth_env.py` registers it (the one registry line) and takes it through SFT data,
SFT, RL and evaluation."""
