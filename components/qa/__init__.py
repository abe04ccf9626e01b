"""Out-of-domain QA with a search tool: corpus, retriever, environment, datasets, scoring, expert."""
