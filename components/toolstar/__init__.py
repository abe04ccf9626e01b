"""The Tool-Star environment (multi-tool reasoning, arXiv 2505.16410): a model reasons, calls a search tool and a
Python interpreter inline, and ends with a boxed answer.

- `protocol`: reading one assistant turn (`<search>`, `<python>`, `<answer>` with `\\boxed{}`) into a typed action,
  and rendering tool results as `<result>` observations.
- `sandbox`: running model-written Python behind bubblewrap namespaces and resource limits, with a typed result.
- `env`: `ToolStarEnv(task, retriever, sandbox, max_tool_calls=3)`, the episode (`reset`, `step`) the agent loop
  drives: searches and programs answered as `<result>` user messages, a boxed answer ending it, running counts of
  calls, code errors, sandbox kills and format errors in `info["stats"]`.
- `tasks`: the offline, seeded task set (`generate_tasks`): multi-hop questions over the generated encyclopedia
  whose answers are arithmetic on the years its passages state (search + python), and computation problems (python
  only); the `Task` type and its JSONL file (`write_tasks`, `read_tasks`).
- `expert`: the programmatic expert policy (`ToolStarExpertPolicy`): searches for each fact, computes with a
  program, answers with `\\boxed{}`; it solves every generated task.
- `reward`: Tool-Star's hierarchical reward as pure functions: -1 for a format error, else the answer's score
  (Tool-Star: token F1), plus 0.1 when the answer scores and both tools were used.

Layering: the package sits at the environment level, beside `components.travel`, and imports only the shared leaves
(`components.errors`, `components.params`, `components.jsonl`). The retriever is passed in (any object with
`search(query)`, such as the QA stage's BM25 retriever) and the encyclopedia is read as corpus passages, so nothing
here imports `components.evaluation`.

No ML imports here (no torch, no transformers): the package runs wherever the pipeline's data stages do.
"""
