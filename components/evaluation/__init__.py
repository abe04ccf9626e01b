"""Evaluation: validation runs on TravelPlanner, out-of-domain QA with a search tool, the alignment tax, reports."""
