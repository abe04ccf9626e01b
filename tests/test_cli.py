"""The `star` command's error handling: storage failures are one line with what to do, never a traceback."""
import errno
import json
from pathlib import Path

import pytest

from components.cli import main, storage_error


def test_a_full_disk_while_writing_an_output_is_one_line_naming_the_file(tiny_world_dir, tmp_path, capsys):
    queries = Path(__file__).parent / "fixtures" / "train_queries.jsonl"
    idx = json.loads(queries.read_text().splitlines()[0])["idx"]
    (tmp_path / "plans.jsonl").write_text(json.dumps({"idx": idx, "plan": []}) + "\n")
    code = main(["evaluate", "--world", str(tiny_world_dir), "--queries", str(queries),
                 "--plans", str(tmp_path / "plans.jsonl"), "--out", "/dev/full"])  # writes fail with ENOSPC
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("star evaluate: error: cannot write /dev/full: No space left on device; "
                                            "free some space (or point the output elsewhere) and rerun")


@pytest.mark.parametrize("number, advice", [(errno.EACCES, "make it writable"), (errno.EROFS, "read-only"),
                                            (errno.EDQUOT, "quota")])
def test_unwritable_outputs_say_what_to_do(number, advice):
    message = storage_error(OSError(number, "denied", "models/sft/model.safetensors"))
    assert message.startswith("cannot write models/sft/model.safetensors: denied; ") and advice in message


def test_other_os_errors_keep_their_traceback():
    assert storage_error(OSError(errno.ECONNREFUSED, "refused")) is None


def test_exit_codes_say_whose_mistake_it_was(tmp_path, capsys):
    """2: the command line itself (argparse); 1: the input, params or environment it names."""
    with pytest.raises(SystemExit) as usage:
        main(["evaluate", "--no-such-option"])
    assert usage.value.code == 2
    assert main(["world", "build", "--params", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "w")]) == 1
    assert "missing.yaml" in capsys.readouterr().err
