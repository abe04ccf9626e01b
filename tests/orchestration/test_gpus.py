"""GPU slots: visible devices, the limit size, and exclusive device claims."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from components.orchestration.gpus import claim_devices, cuda_env, slot_count, visible_gpus


def test_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_the_limit_has_one_slot_per_gpu_and_one_on_cpu_machines():
    assert slot_count(["0", "1", "2", "3"]) == 4
    assert slot_count([]) == 1


def test_cuda_env_pins_devices_only_when_there_are_some():
    assert cuda_env(["1", "3"]) == {"CUDA_VISIBLE_DEVICES": "1,3"}
    assert cuda_env([]) == {}


def test_claims_are_exclusive_and_released(tmp_path):
    with claim_devices(1, ["0", "1"], lock_dir=tmp_path) as first:
        with claim_devices(1, ["0", "1"], lock_dir=tmp_path) as second:
            assert first != second and sorted(first + second) == ["0", "1"]
    with claim_devices(2, ["0", "1"], lock_dir=tmp_path) as both:
        assert both == ["0", "1"]


def test_a_claim_waits_until_the_device_is_free(tmp_path):
    events = []

    def hold():
        with claim_devices(1, ["0"], lock_dir=tmp_path):
            events.append(("a", "start", time.monotonic()))
            time.sleep(0.4)
            events.append(("a", "end", time.monotonic()))

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.1)
    with claim_devices(1, ["0"], lock_dir=tmp_path, poll_seconds=0.05) as devices:
        events.append(("b", "start", time.monotonic()))
    holder.join()
    assert devices == ["0"]
    assert [e[:2] for e in events] == [("a", "start"), ("a", "end"), ("b", "start")]


def test_no_gpus_means_no_devices_to_claim(tmp_path):
    with claim_devices(1, [], lock_dir=tmp_path) as devices:
        assert devices == []


def test_local_slots_let_one_holder_in_at_a_time_and_wake_the_next_at_once():
    from components.orchestration.gpus import LocalSlots

    slots = LocalSlots(1)
    events = []

    def stage(name):
        with slots.hold(1):
            events.append((name, "start", time.monotonic()))
            time.sleep(0.2)
            events.append((name, "end", time.monotonic()))

    threads = [threading.Thread(target=stage, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kinds = [e[1] for e in events]
    assert kinds == ["start", "end", "start", "end"]
    assert events[2][2] - events[1][2] < 0.1  # the second starts as soon as the first ends
    assert slots.free == 1


def test_a_stage_takes_as_many_slots_as_its_processes_and_is_refused_more_gpus_than_shown():
    from components.errors import UserError
    from components.orchestration.gpus import slots_needed

    assert slots_needed("rl", 2, ["0", "1", "2"]) == 2
    assert slots_needed("rl", 2, []) == 1  # a CPU machine's one slot: the processes share its cores
    with pytest.raises(UserError, match="stage rl needs 4 GPUs .* this machine shows 2"):
        slots_needed("rl", 4, ["0", "1"])


def test_meta_gpu_names_the_params_key_of_the_process_count(tmp_path):
    from components.errors import UserError
    from components.orchestration.graph import gpu_need

    (tmp_path / "params").mkdir()
    (tmp_path / "params/rl.yaml").write_text("rl:\n  distributed:\n    processes: 4\n")
    assert gpu_need("params/rl.yaml:rl.distributed.processes", tmp_path) == 4
    assert gpu_need("params/rl.yaml:rl.missing.processes", tmp_path) == 1  # unset: the default, one process
    assert gpu_need(2, tmp_path) == 2
    with pytest.raises(UserError, match="a number or FILE:KEY"):
        gpu_need("two", tmp_path, "rl")


def test_the_training_stages_take_the_gpus_their_params_start_processes_on():
    """dvc.yaml's rl stage takes rl.distributed.processes slots: the torchrun `star rl` starts has that many."""
    import yaml

    from components.orchestration.graph import gpu_need

    root = Path(__file__).resolve().parents[2]
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert stages["rl"]["meta"]["gpu"] == "params/rl.yaml:rl.distributed.processes"
    assert stages["toolstar_rl"]["meta"]["gpu"] == "params/toolstar_rl.yaml:toolstar_rl.distributed.processes"
    assert gpu_need(stages["rl"]["meta"]["gpu"], root) == 1  # the committed (tiny) params
