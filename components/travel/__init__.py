"""The TravelPlanner sandbox: world tables, tools, chat protocol, episodes, plans and the evaluator.

This package never imports torch or transformers, so the sandbox starts instantly and runs anywhere.
"""
