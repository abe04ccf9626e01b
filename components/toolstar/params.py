"""params/toolstar.yaml, section `toolstar`: the Tool-Star branch's tasks, expert trajectories and evaluation.

The branch (docs/architecture.md): `star toolstar tasks` draws the task sets from the QA stage's encyclopedia,
`star toolstar teach` turns the programmatic expert's solved episodes into SFT records, `star sft --section
toolstar_sft` fine-tunes on them (params/toolstar_sft.yaml), and `star toolstar eval` scores a checkpoint. The
retriever and decoding params are the QA stage's and the evaluation's own types, so one YAML key means one thing
everywhere; the sandbox is `components.toolstar.sandbox.SandboxParams`.
"""
from __future__ import annotations

from pydantic import Field

from components.agent.params import DecodingParams, LimitsParams
from components.params import Params
from components.retrieval import RetrieverParams
from components.toolstar.reward import Metric
from components.toolstar.sandbox import SandboxParams


class TaskCounts(Params):
    """How many tasks of each kind one split holds (`components/toolstar/tasks.py`)."""

    multi_hop: int = Field(0, ge=0)  # multi-hop arithmetic over the encyclopedia: search + python
    compute: int = Field(0, ge=0)  # computation problems: python only

    @property
    def total(self) -> int:
        return self.multi_hop + self.compute


class TaskSplits(Params):
    """The two task sets, drawn together so that no question is in both."""

    sft: TaskCounts = TaskCounts(multi_hop=60, compute=40)  # the expert solves these for the SFT records
    val: TaskCounts = TaskCounts(multi_hop=12, compute=8)  # held out: `star toolstar eval`


class TeachParams(Params):
    """The expert's episodes (`star toolstar teach`) and how its solved ones become SFT records."""

    max_turns: int = Field(8, ge=1)  # an expert episode takes at most 3 searches, a program and the answer
    eval_fraction: float = Field(0.1, ge=0, lt=1)  # held-out share of the records (data/.../eval.jsonl)
    chars_per_token: float = Field(4.2, gt=0)  # the records' `num_tokens` estimate (the sft_data stage's)


class ToolStarEvalParams(Params):
    """Greedy episodes of a checkpoint on the held-out tasks (`star toolstar eval`)."""

    limits: LimitsParams = LimitsParams(max_turns=6, max_tokens_per_turn=256, max_context_tokens=2048,
                                        max_protocol_errors=2)
    decoding: DecodingParams = DecodingParams(batch_size=20)
    max_tasks: int | None = Field(None, ge=1)  # only the first N tasks of the file (quick runs)


class ToolStarParams(Params):
    """params/toolstar.yaml, section `toolstar`."""

    seed: int = 0  # the task draw and the SFT records' train/eval split
    tasks: TaskSplits = TaskSplits()
    max_tool_calls: int = Field(3, ge=0)  # per episode, searches and programs together (Tool-Star's rollout: 3)
    # components/toolstar/reward.py: auto = numeric for number answers, else F1; a dataset's math task math_verify
    # ("math"), its QA task F1 (reward.task_metric); f1 | em | numeric | math score every task the same way
    reward_metric: Metric = "auto"
    retriever: RetrieverParams = RetrieverParams(top_k=1)  # the search tool (the QA stage's retriever types)
    sandbox: SandboxParams = SandboxParams()  # how model-written Python runs
    teach: TeachParams = TeachParams()
    eval: ToolStarEvalParams = ToolStarEvalParams()
