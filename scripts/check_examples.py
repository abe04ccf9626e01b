"""Every command example a user is shown runs as written, or at least parses.

The examples: the README's fenced ```bash blocks and its backticked `star …`, `dvc …`, `python …` and `pytest …`
commands (the command table and the prose), the backticked commands in dvc.yaml's comments, and the lines starting
with `star ` or `dvc ` in the description or epilog of every `star` sub-command (`star <command> --help`).

Each example is classified in EXAMPLES below, a reviewed table: example text (whitespace collapsed) -> how it is
checked, with its placeholders (DIR, Q.jsonl, P, NAME, ...) replaced by paths of a smoke-reproduced checkout:

  run      runnable on a checkout where `star preset use smoke && dvc repro` has run, in seconds to minutes;
  parse    needs what CI lacks (a GPU, a Prefect server, the real TravelPlanner data, hours): parsed only;
  covered  not a command of its own to run here (shell set-up, the test suite, the 2-hour tiny pipeline, the stage
           commands `dvc repro` runs); parsed where it holds `star`/`dvc` commands.

Always (seconds): every `star` and `dvc` command of every example, runnable or not, parses with the real argparse
parser (`components.cli.build_parser`, DVC's own), every `params/<file>.yaml:<key>=<value>` override names an
existing key, and every stage `cmd` in dvc.yaml parses. An example the table does not classify fails (a new
example in the docs must be classified here), and so does a table entry no document shows any more.

    python scripts/check_examples.py          # extract, classify and parse (seconds)
    python scripts/check_examples.py --run    # also run the runnable ones (after `star preset use smoke && dvc repro`)

`--run` runs each runnable example in this checkout with a timeout, prints one line per example (ok, or failed with
the line saying what went wrong), and exits 1 on any failure. Outputs go to a temporary folder; `dvc plots`' HTML
folder is removed afterwards, and `dvc exp run` (run last) has params/, dvc.lock, metrics/, plots/ and the DVC-cached
outputs put back, so a following `dvc repro` still skips every stage (checked with `dvc status`).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # parse with this checkout's parser, even where another checkout is installed
    sys.path.insert(0, str(ROOT))

COMMAND_PREFIXES = ("star", "dvc", "python ", "pytest", "./scripts/", ".venv/bin/")
OVERRIDE = re.compile(r"params/([\w.-]+)\.yaml:([\w.]+)=([\w.-]+)")
STAR_AND_DVC = ("star", "dvc")  # the programs whose commands are extracted from dvc.yaml and --help texts

# Why parse-only examples are not run here.
GPU = "needs GPUs (a Qwen2.5 preset: vLLM and DeepSpeed)"
PREFECT = "runs variants as DVC experiments through a Prefect flow (a server, and minutes per variant)"
REAL_DATA = "needs the real TravelPlanner database (a DIR holding database/)"
CRON = "registers a cron deployment with a Prefect server and its worker"
MINUTES = "another RL run like the `rl.reward.kind=macro` one, run above (minutes each on smoke)"


@dataclass(frozen=True)
class Check:
    """How one example is checked. `command`: what is run (or parsed), placeholders replaced ({tmp}: a temporary
    folder); empty means the example as shown. `restore`: put the workspace back after running it."""
    how: str  # run | parse | covered
    command: str = ""
    why: str = ""
    timeout: float = 120.0
    restore: bool = False
    cleanup: tuple[str, ...] = ()  # workspace paths the command writes, removed after it (if absent before)


# The reviewed table: example as shown (whitespace collapsed) -> how it is checked.
EXAMPLES: dict[str, Check] = {
    # README: install and tests (what .ci/run itself does first)
    "./scripts/bootstrap.sh && . .venv/bin/activate && star preset use tiny && dvc repro": Check(
        "covered", why=".ci/run runs bootstrap.sh; the tiny `dvc repro` takes ~2 h on 2 cores (measured in "
                       "benchmarks/results/tiny.md); its smoke counterpart is the tests' shared smoke project "
                       "(tests/integration/conftest.py: smoke_project)"),
    "./scripts/bootstrap.sh && .venv/bin/pytest -q": Check("covered", why=".ci/run runs bootstrap.sh and pytest -q"),
    "pytest -q -m quick": Check("covered", why="a subset of .ci/run's pytest -q"),
    ". .venv/bin/activate": Check("covered", why="shell set-up"),
    # README: presets, UIs, tracking
    "star preset use NAME": Check("run", "star preset use smoke", restore=True),  # on smoke: changes nothing
    "star ui": Check("run", timeout=60),
    "star mlflow replay": Check("run", timeout=60),
    "star --help": Check("run", timeout=60),
    "star <command> --help": Check("run", "star rollout --help", timeout=60),
    # README: the command table
    "dvc repro": Check("run", timeout=600),  # after a repro: skips every stage
    "star run [--preset P] [--stages ...]": Check("parse", "star run --preset qwen2.5-7b --stages rl validate",
                                                   why=GPU + "; runs the pipeline through Prefect"),
    "star run": Check("parse", why="runs the pipeline through Prefect; `dvc repro` runs the same graph"),
    "star sweep --variant NAME=FILE:KEY=VALUE ...": Check(
        "parse", "star sweep --variant macro=params/rl.yaml:rl.reward.kind=macro", why=PREFECT),
    "star deploy": Check("parse", why=CRON),
    "star world import --source DIR --out DIR": Check(
        "parse", "star world import --source travelplanner --out {tmp}/world", why=REAL_DATA),
    "star world layout-reference --reference DIR --out DIR": Check(
        "parse", "star world layout-reference --reference travelplanner --out {tmp}/travelplanner", why=REAL_DATA),
    "star tool --world data/world SearchFlight "
    "'{\"departure\": \"Palavi\", \"destination\": \"Gorvibri\", \"date\": \"2022-03-01\"}'":
        Check("run", "star tool --world data/world SearchFlight "
                     "'{\"departure\": \"Palavi\", \"destination\": \"Gorvibri\", \"date\": \"2022-03-01\"}'",
              timeout=60),
    "star evaluate --world DIR --queries Q.jsonl --plans P.jsonl --mode both --out M.json": Check(
        "run", "star evaluate --world data/world --queries data/queries/val.jsonl --plans data/validate/sft.jsonl "
               "--mode both --out {tmp}/M.json"),
    "star rollout --model DIR --world DIR --queries Q.jsonl --out T.jsonl": Check(
        "run", "star rollout --model models/sft --world data/world --queries data/queries/val.jsonl "
               "--out {tmp}/T.jsonl", timeout=300),
    "star rl --plan [--gpu-memory-gib 80]": Check("run", "star rl --plan --gpu-memory-gib 80", timeout=60),
    "star queries": Check("covered", why="a stage: `dvc repro` runs it, and every dvc.yaml stage cmd is parsed"),
    # README: running and comparing experiments
    "dvc exp run -S params/rl.yaml:rl.reward.kind=macro": Check("run", timeout=900, restore=True),
    "dvc exp run -S params/rl.yaml:rl.algorithm=dapo": Check("parse", why=MINUTES),
    "dvc exp run -S params/rl.yaml:rl.max_queries=50": Check("parse", why=MINUTES),
    "dvc exp show && dvc metrics diff && dvc plots diff": Check("run", timeout=300, cleanup=("dvc_plots",)),
    "star run --preset qwen2.5-7b --stages rl validate": Check("parse", why=GPU),
    "star sweep --variant sum=params/rl.yaml:rl.reward.kind=sum --variant macro=params/rl.yaml:rl.reward.kind=macro":
        Check("parse", why=PREFECT),
    "python scripts/compare_rl_runs.py RUN/plots/rl/rewards.csv CONTROL/plots/rl/rewards.csv": Check(
        "run", "python scripts/compare_rl_runs.py plots/rl/rewards.csv plots/rl/rewards.csv", timeout=60),
    # dvc.yaml comments
    "dvc plots show": Check("run", timeout=300, cleanup=("dvc_plots",)),
    "dvc plots diff": Check("run", timeout=300, cleanup=("dvc_plots",)),
    # star <command> --help
    "star evaluate --world data/world --queries data/queries/val.jsonl --plans plans.jsonl --mode both "
    "--out eval.json": Check(
        "run", "star evaluate --world data/world --queries data/queries/val.jsonl --plans data/validate/sft.jsonl "
               "--mode both --out {tmp}/eval.json"),  # not into metrics/: the report stage depends on it
}


@dataclass
class Example:
    text: str
    sources: list[str] = field(default_factory=list)


def collapse(text: str) -> str:
    return " ".join(text.split())


def is_command(text: str, prefixes: tuple[str, ...] = COMMAND_PREFIXES) -> bool:
    """A command line of one of these programs (a bare `star` or `dvc` names the program, it is no example)."""
    return text.startswith(tuple(p if p.endswith(("/", " ")) else p + " " for p in prefixes))


def join_continued(lines: list[str]) -> list[tuple[int, str]]:
    """(first line number, logical line) with backslash-continued lines joined."""
    joined: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append((start, pending + line))
        pending = ""
    if pending:
        joined.append((start, pending))
    return joined


def strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (a `#` outside quotes after whitespace)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


BACKTICKED = re.compile(r"`([^`\n]+)`")


def readme_examples(path: Path) -> list[tuple[str, str]]:
    """(source, example) from a Markdown file: fenced bash lines and backticked commands outside fences."""
    found, in_bash, in_fence = [], False, False
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[tuple[int, str]] = []
    bash: list[str] = []
    bash_start = 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if in_fence:
                if in_bash:
                    for offset, logical in join_continued(bash):
                        command = collapse(strip_comment(logical))
                        if command:
                            found.append((f"{path.name}:{bash_start + offset}", command))
                in_fence = in_bash = False
            else:
                in_fence, in_bash = True, stripped[3:].strip() in ("bash", "sh", "shell", "console")
                bash, bash_start = [], number
            continue
        if in_fence:
            if in_bash:
                bash.append(line)
            continue
        prose.append((number, line))
    for number, line in prose:
        for span in BACKTICKED.findall(line):
            if is_command(collapse(span)):
                found.append((f"{path.name}:{number}", collapse(span)))
    return found


def dvc_yaml_examples(path: Path) -> list[tuple[str, str]]:
    """(source, example) for the backticked `star`/`dvc` commands in dvc.yaml's comment lines."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().startswith("#"):
            for span in BACKTICKED.findall(line):
                if is_command(collapse(span), STAR_AND_DVC):
                    found.append((f"{path.name}:{number}", collapse(span)))
    return found


def walk_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("star",)):
    """(command path, parser) for `star` and every sub-command below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share a parser
                    seen.add(id(sub))
                    yield from walk_parsers(sub, (*path, name))


def help_examples(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(source, example) for the lines of descriptions and epilogs that start with `star ` or `dvc `."""
    found = []
    for path, sub in walk_parsers(parser):
        for text in (sub.description, sub.epilog):
            for _, logical in join_continued((text or "").splitlines()):
                line = collapse(logical)
                if is_command(line, STAR_AND_DVC):
                    found.append((f"{' '.join(path)} --help", line))
    return found


def extract(root: Path = ROOT, parser: argparse.ArgumentParser | None = None) -> list[Example]:
    """Every example shown to users, in order of first appearance, each with where it is shown."""
    parser = parser or star_parser()
    examples: dict[str, Example] = {}
    for source, text in [*readme_examples(root / "README.md"), *dvc_yaml_examples(root / "dvc.yaml"),
                         *help_examples(parser)]:
        examples.setdefault(text, Example(text)).sources.append(source)
    return list(examples.values())


def star_parser() -> argparse.ArgumentParser:
    from components.cli import build_parser

    return build_parser()


def dvc_parser() -> argparse.ArgumentParser:
    from dvc.cli.parser import get_main_parser

    return get_main_parser()


def segments(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ||, ;, |), each as its argv."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [part for part in parts if part]


class MessageCollector(logging.Handler):
    """Writes each record's bare message to `stream`: no formatter or terminal state that a test or DVC's own logging
    set-up may have changed can make the error line disappear."""

    def __init__(self, stream: io.StringIO):
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format string
            message = str(record.msg)
        self.stream.write(message + "\n")


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None when `argv` parses (or is a --help request), else argparse's error line."""
    out, err = io.StringIO(), io.StringIO()
    # DVC's parser logs its error through the `dvc` logger's handlers (bound to the terminal), then raises; the
    # record is kept from the root logger's handlers too (a handler another library left there may be broken and
    # would print its own traceback into this capture)
    dvc_log = logging.getLogger("dvc")
    handlers, propagate = dvc_log.handlers, dvc_log.propagate
    dvc_log.handlers, dvc_log.propagate = [MessageCollector(err)], False
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        return error_line(err.getvalue() + out.getvalue()) or f"exit {exc.code}"
    except Exception as exc:
        return error_line(err.getvalue()) or f"{type(exc).__name__}: {exc}"
    finally:
        dvc_log.handlers, dvc_log.propagate = handlers, propagate
    return None


def error_line(output: str) -> str:
    """The line of a command's output that says what went wrong: the last one mentioning an error (a traceback's
    exception, argparse's `error:` line), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else ""


def override_problems(command: str, root: Path = ROOT) -> list[str]:
    """What is wrong with each `params/<file>.yaml:<key>=<value>` override in `command` (a missing file or key, or
    a key naming a section)."""
    problems = []
    for family, key, _ in OVERRIDE.findall(command):
        params = root / "params" / f"{family}.yaml"
        if not params.is_file():
            problems.append(f"no params file params/{family}.yaml")
            continue
        node = yaml.safe_load(params.read_text(encoding="utf-8"))
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                problems.append(f"params/{family}.yaml has no key {key}")
                break
            node = node[part]
        else:
            if isinstance(node, dict):
                problems.append(f"{key} in params/{family}.yaml is a section, not a value")
    return problems


class Parsers:
    """The `star` and `dvc` parsers, built once."""

    def __init__(self, star: argparse.ArgumentParser | None = None):
        self.star = star or star_parser()
        self._dvc: argparse.ArgumentParser | None = None

    def problems(self, command: str, root: Path = ROOT) -> list[str]:
        """Parse errors of the `star`/`dvc` commands in a shell line, and its bad overrides."""
        found = []
        for argv in segments(command.replace("{tmp}", "/tmp/x")):
            if argv[0] == "star":
                error = parse_error(self.star, argv[1:])
            elif argv[0] == "dvc":
                self._dvc = self._dvc or dvc_parser()
                error = parse_error(self._dvc, argv[1:])
            else:
                continue
            if error:
                found.append(f"`{shlex.join(argv)}` does not parse: {error}")
        return found + override_problems(command, root)


def stage_commands(root: Path = ROOT) -> list[tuple[str, str]]:
    """(stage, cmd) for every stage of dvc.yaml, foreach stages expanded."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    variables: dict = {}
    for entry in spec.get("vars") or []:
        if isinstance(entry, dict):
            variables.update(entry)
    commands = []
    for name, stage in (spec.get("stages") or {}).items():
        if "foreach" in stage:
            items = stage["foreach"]
            if isinstance(items, str):
                items = variables.get(items.strip("${} "), [])
            for item in items:
                cmd = stage["do"]["cmd"]
                commands.append((f"{name}@{item}", str(cmd).replace("${item}", str(item))))
        else:
            commands.append((name, str(stage.get("cmd", ""))))
    return commands


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def ok(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def fail(self, line: str) -> None:
        self.failures.append(line)
        self.lines.append(line)
        print(line, flush=True)


def check_static(report: Report, root: Path = ROOT, parsers: Parsers | None = None) -> list[tuple[Example, Check]]:
    """Classify and parse every example (and every dvc.yaml stage cmd); return the classified ones."""
    parsers = parsers or Parsers()
    examples = extract(root, parsers.star)
    classified = []
    for example in examples:
        check = EXAMPLES.get(example.text)
        where = ", ".join(example.sources)
        if check is None:
            report.fail(f"UNCLASSIFIED {example.text}  [{where}]: add it to EXAMPLES in scripts/check_examples.py")
            continue
        classified.append((example, check))
        problems = parsers.problems(check.command or example.text, root)
        if check.command:  # the overrides as shown, and the example itself unless it holds placeholders
            problems += (override_problems(example.text, root) if has_placeholder(example.text)
                         else parsers.problems(example.text, root))
        for problem in dict.fromkeys(problems):
            report.fail(f"FAILED {example.text}  [{where}]: {problem}")
    shown = {example.text for example in examples}
    for text in EXAMPLES:
        if text not in shown:
            report.fail(f"STALE {text}: no document shows it any more; remove it from EXAMPLES")
    for stage, cmd in stage_commands(root):
        for problem in parsers.problems(cmd, root):
            report.fail(f"FAILED dvc.yaml stage {stage}: {problem}")
    return classified


PLACEHOLDER = re.compile(r"\b(DIR|NAME|P|Q\.jsonl|P\.jsonl|M\.json|T\.jsonl|RUN|CONTROL)\b|<[^>]+>|\[|\.\.\.")


def has_placeholder(text: str) -> bool:
    return bool(PLACEHOLDER.search(text))


WORKSPACE_STATE = ("params", "dvc.lock", "metrics", "plots")


@contextlib.contextmanager
def restored_workspace(root: Path):
    """Put params/, dvc.lock, metrics/ and plots/ back afterwards, and the DVC-cached outputs with `dvc checkout`."""
    with tempfile.TemporaryDirectory(prefix="star-examples-state-") as saved:
        for name in WORKSPACE_STATE:
            source = root / name
            if source.is_dir():
                shutil.copytree(source, Path(saved) / name)
            elif source.is_file():
                shutil.copy2(source, Path(saved) / name)
        try:
            yield
        finally:
            for name in WORKSPACE_STATE:
                target, copy = root / name, Path(saved) / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                if copy.is_dir():
                    shutil.copytree(copy, target)
                elif copy.is_file():
                    shutil.copy2(copy, target)
            subprocess.run(["dvc", "checkout", "--force", "--quiet"], cwd=root, env=run_environment(root),
                           capture_output=True, text=True)


def run_environment(root: Path) -> dict[str, str]:
    """This checkout's code first on the path (so `star` runs it), this interpreter's `star` and `dvc` first on PATH,
    one thread per library, no colour."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("NO_COLOR", "1")
    if not git_identity(root):  # `dvc exp run` records its experiment as a git commit (a fresh CI clone has no user)
        for role in ("AUTHOR", "COMMITTER"):
            env.setdefault(f"GIT_{role}_NAME", "star check_examples")
            env.setdefault(f"GIT_{role}_EMAIL", "check-examples@star.invalid")
    return env


def git_identity(root: Path) -> bool:
    """Whether git in `root` knows who commits (user.name and user.email)."""
    return all(subprocess.run(["git", "config", "--get", key], cwd=root, capture_output=True).returncode == 0
               for key in ("user.name", "user.email"))


def run_one(example: Example, check: Check, root: Path, tmp: Path) -> tuple[bool, str, float]:
    """Run a runnable example in `root`; (ok, first error line or '', seconds)."""
    command = (check.command or example.text).replace("{tmp}", str(tmp))
    absent = [path for path in check.cleanup if not (root / path).exists()]
    started = time.monotonic()
    context = restored_workspace(root) if check.restore else contextlib.nullcontext()
    try:
        with context:
            returncode, output = run_shell(command, root, check.timeout)
    finally:
        for path in absent:
            target = root / path
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            elif target.exists():
                target.unlink()
    seconds = time.monotonic() - started
    if returncode is None:
        return False, f"timed out after {check.timeout:.0f} s", seconds
    if returncode != 0:
        return False, f"exit {returncode}: {error_line(output)}", seconds
    return True, "", seconds


def run_shell(command: str, root: Path, timeout: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, stdout + stderr) of a shell line run in `root`; on a timeout or Ctrl-C the
    whole process group goes (a `dvc exp run` and the stages it started)."""
    process = subprocess.Popen(["bash", "-o", "pipefail", "-c", command], cwd=root, env=run_environment(root),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException as exc:  # TimeoutExpired, KeyboardInterrupt
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return None, err + out
    return process.returncode, err + out


def workspace_problem(root: Path) -> str | None:
    """None when `dvc status` finds every stage up to date, else what it says (after the examples ran)."""
    result = subprocess.run(["dvc", "status", "--quiet"], cwd=root, env=run_environment(root), capture_output=True,
                            text=True)
    if result.returncode == 0:
        return None
    status = subprocess.run(["dvc", "status"], cwd=root, env=run_environment(root), capture_output=True, text=True)
    return collapse(status.stdout + status.stderr)[:300]


def check_runs(report: Report, classified: list[tuple[Example, Check]], root: Path = ROOT) -> None:
    """Run every runnable example (on a smoke-reproduced checkout), one line each."""
    if not (root / "dvc.lock").is_file() or workspace_problem(root):
        report.fail("FAILED --run needs a reproduced checkout: run `star preset use smoke && dvc repro` first")
        return
    # `dvc exp run` and the like change the workspace: run them last
    ordered = sorted(classified, key=lambda pair: pair[1].restore)
    with tempfile.TemporaryDirectory(prefix="star-examples-") as tmp:
        for example, check in ordered:
            if check.how != "run":
                continue
            ok, error, seconds = run_one(example, check, root, Path(tmp))
            (report.ok if ok else report.fail)(
                f"{'ok' if ok else 'FAILED'} {seconds:6.1f} s  {example.text}" + (f": {error}" if error else ""))
    problem = workspace_problem(root)
    if problem:
        report.fail(f"FAILED the examples left the workspace changed (dvc status): {problem}")


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                  epilog="Without --run: extract, classify and parse only (seconds).")
    cli.add_argument("--run", action="store_true", help="also run the runnable examples in this checkout "
                                                        "(after `star preset use smoke && dvc repro`)")
    cli.add_argument("--list", action="store_true", help="print every example with its classification")
    args = cli.parse_args(argv)
    report = Report()
    classified = check_static(report)
    if args.list:
        for example, check in classified:
            print(f"{check.how:<8} {example.text}  [{', '.join(example.sources)}]"
                  + (f"\n         -> {check.command}" if check.command else "")
                  + (f"\n         ({check.why})" if check.why else ""))
    counts = {how: sum(1 for _, c in classified if c.how == how) for how in ("run", "parse", "covered")}
    print(f"{len(classified)} examples classified ({counts['run']} run, {counts['parse']} parse-only, "
          f"{counts['covered']} covered elsewhere); every star/dvc command parsed", flush=True)
    if args.run and not report.failures:
        check_runs(report, classified)
    if report.failures:
        print(f"{len(report.failures)} failure(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
