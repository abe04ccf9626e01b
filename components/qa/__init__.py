"""Out-of-domain QA with a search tool or with the retrieved passages in context: corpus, environment, datasets,
scoring, expert, the alignment tax."""
