"""The Trainer backend's own pieces: its logs become the torch loop's history rows, and its arguments carry the
shared LR schedule (the end-to-end run is in test_sft.py)."""
from types import SimpleNamespace

from components.training.sft import SFTParams
from components.training.sft_trainer import HistoryCallback, history_row, training_arguments


def test_a_trainer_log_becomes_a_history_row_with_the_torch_loop_names():
    logs = {"loss": 2.5, "learning_rate": 1e-3, "grad_norm": 0.7, "epoch": 0.5, "total_flos": 1.0}
    assert history_row(3, 0.51234, logs) == {"step": 3, "epoch": 0.5123, "train_loss": 2.5, "learning_rate": 1e-3,
                                             "grad_norm": 0.7}


def test_the_train_and_eval_logs_of_a_step_merge_into_one_row_and_each_is_reported():
    history, reported = [], []
    callback = HistoryCallback(history, report=lambda metrics, step: reported.append((step, metrics)))
    state = SimpleNamespace(global_step=2, epoch=1.0)
    callback.on_log(None, state, None, logs={"loss": 1.5, "learning_rate": 1e-3})
    callback.on_log(None, state, None, logs={"eval_loss": 1.2})
    callback.on_log(None, state, None, logs={"train_runtime": 9.0})  # nothing of ours: not reported
    assert history == [{"step": 2, "epoch": 1.0, "train_loss": 1.5, "learning_rate": 1e-3, "eval_loss": 1.2}]
    assert reported == [(2, {"epoch": 1.0, "train_loss": 1.5, "learning_rate": 1e-3}),
                        (2, {"epoch": 1.0, "eval_loss": 1.2})]


def test_the_trainer_gets_the_shared_schedule_with_whole_warmup_steps(tmp_path):
    params = SFTParams(epochs=1, batch_size=4, micro_batch_size=2, warmup_ratio=0.25, lr_scheduler_type="constant")
    args = training_arguments(params, tmp_path, num_examples=40, evaluate=False, ds_config=None)  # 10 steps
    assert str(args.lr_scheduler_type.value) == "constant_with_warmup"  # transformers' "constant" has no warmup
    assert args.warmup_steps == 3 and args.gradient_accumulation_steps == 2
