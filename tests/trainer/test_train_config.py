"""The ``spanrl train`` config: every example's train.yaml builds a Trainer from any folder, every key is
documented in docs/train-config.md, and an unknown key names the nearest valid one."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spanrl.algorithms import ALGORITHMS, algorithm_class
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.lora import LoRAConfig
from spanrl.cli import main
from spanrl.errors import ConfigError, ServingError, StoreUnavailableError, TrainingError
from spanrl.rollouts import RolloutsConfig
from spanrl.trainer import RunnerConfig, TrainerConfig
from spanrl.trainer.train_config import TINY_KEYS, TOP_LEVEL_KEYS, build_trainer

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIGS = sorted(REPO.glob("examples/*/train.yaml"))
DOC = REPO / "docs" / "train-config.md"
ONLINE_DOC = REPO / "docs" / "online-config.md"


def _documented_keys() -> set[str]:
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", DOC.read_text(), flags=re.MULTILINE))


def test_every_example_that_trains_ships_a_config() -> None:
    names = {path.parent.name for path in EXAMPLE_CONFIGS}
    assert {"calculator", "search_qa", "langchain_agent", "text2sql", "node-agent", "quickstart"} <= names


@pytest.mark.parametrize("config", EXAMPLE_CONFIGS, ids=lambda p: p.parent.name)
def test_example_config_builds_a_trainer_from_another_folder(config: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # as a user would run it: not from the checkout
    raw = yaml.safe_load(config.read_text())
    trainer = build_trainer({**raw, "output_dir": str(tmp_path / "run")}, base=config.parent)
    assert trainer.model_path.is_dir() and (trainer.model_path / "config.json").is_file()
    assert len(trainer.tasks) >= trainer.config.tasks_per_step
    assert trainer.algorithm.config is not None
    agent = trainer.agent
    if callable(agent):  # the quick-start environment, played in process
        assert agent.__name__ == "ArithEnvAgent"
    else:
        assert agent[0] in (sys.executable, "node")
        assert any(os.path.isabs(word) and Path(word).is_file() for word in agent[1:]), agent
    # the tiny model is built once and reused
    again = build_trainer({**raw, "output_dir": str(tmp_path / "run")}, base=config.parent)
    assert again.model_path == trainer.model_path


def test_the_docs_name_every_key() -> None:
    documented = _documented_keys()
    expected = set(TOP_LEVEL_KEYS) | set(TINY_KEYS)
    from spanrl.algorithms.policies import AgentPolicy

    for cls in (TrainerConfig, RunnerConfig, RolloutsConfig, CreditConfig, LoRAConfig, AgentPolicy):
        expected |= {f.name for f in dataclasses.fields(cls)} - {"runner"}
    for name in ALGORITHMS:
        expected |= {f.name for f in dataclasses.fields(algorithm_class(name).config_class)}
    assert expected - documented == set(), "docs/train-config.md misses these keys"
    text = DOC.read_text()
    assert all(f"examples/{p.parent.name}/train.yaml" in text for p in EXAMPLE_CONFIGS)


def test_the_online_docs_name_every_key_and_no_other() -> None:
    from spanrl.online import OnlineConfig

    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", ONLINE_DOC.read_text(), flags=re.MULTILINE))
    fields = {f.name for f in dataclasses.fields(OnlineConfig)}
    assert fields - documented == set(), "docs/online-config.md misses these keys"
    assert documented - fields == set(), "docs/online-config.md names keys `spanrl train --online` refuses"


def test_train_help_points_to_the_docs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "docs/train-config.md" in shown and "docs/online-config.md" in shown
    assert "Start here: the README's 'Train your own agent'" in shown


@pytest.mark.parametrize("command", [[], ["serve"], ["collector"], ["sql"], ["demo"], ["ui"]])
def test_every_help_says_where_to_start(command: list[str], capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at hyphens: keep the file names whole
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "Start here: the README's 'Train your own agent'" in shown and "docs/train-config.md" in shown
    assert "Train your own agent" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_rollout": 4}, "'n_rollout' is not a trainer setting; did you mean 'n_rollouts'?"),
        ({"eval_evry": 4}, "'eval_evry' is not a trainer setting; did you mean 'eval_every'?"),
        ({"runner": {"worker": 2}}, "runner.worker is not a runner setting; did you mean 'workers'?"),
        ({"credit": {"baselin": "rloo"}}, "credit.baselin is not a credit setting; did you mean 'baseline'?"),
        ({"algorithm": {"name": "grpo", "learning_rat": 1e-3}},
         "algorithm.learning_rat is not an algorithm setting; did you mean 'learning_rate'?"),
        ({"model": {"tiny": {"word": ["a"]}}}, "model.tiny.word is not a tiny model setting; did you mean 'words'?"),
        ({"algorithm": {"name": "grpoo"}}, "algorithm.name must be one of"),
        ({"zzz": 1}, "'zzz' is not a trainer setting \\(valid: "),
    ],
)
def test_unknown_key_names_the_nearest_valid_one(change: dict[str, Any], message: str, tmp_path: Path) -> None:
    raw: dict[str, Any] = {"model": {"tiny": {"words": ["a", "b"]}}, "agent": "python a.py", "tasks": [{"id": "a"}],
                           "tasks_per_step": 1, "output_dir": str(tmp_path / "run"), **change}
    with pytest.raises(ConfigError, match=message):
        build_trainer(raw, base=tmp_path)


def test_the_dr_grpo_preset_sets_the_credits_coupled_field_where_the_config_is_silent(tmp_path: Path) -> None:
    raw: dict[str, Any] = {"model": {"tiny": {"words": ["a", "b"]}}, "agent": "python a.py", "tasks": [{"id": "a"}],
                           "tasks_per_step": 1, "algorithm": {"name": "grpo", "preset": "dr_grpo"}}
    for n, credit in enumerate(({}, {"mode": "step"})):
        trainer = build_trainer({**raw, "credit": credit, "output_dir": str(tmp_path / f"run{n}")}, base=tmp_path)
        assert (trainer.algorithm.config.loss_type, trainer.credit.scale_std) == ("dr_grpo", False)
        assert trainer.credit.mode == credit.get("mode", "identical")
    # said against the preset: refused when the Trainer is built, before any rollout
    with pytest.raises(ConfigError, match=r"^credit scale_std must be false with preset 'dr_grpo' .*, got true$"):
        build_trainer({**raw, "credit": {"scale_std": True}, "output_dir": str(tmp_path / "run2")}, base=tmp_path)
    assert build_trainer({**raw, "algorithm": {"name": "grpo"}, "output_dir": str(tmp_path / "run3")},
                         base=tmp_path).credit.scale_std  # no preset: the credit's own default


def test_cli_reports_a_bad_key_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("model: m\nagent: python a.py\ntasks: [{id: a}]\nn_rollout: 4\n")
    assert main(["train", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spanrl: error: 'n_rollout' is not a trainer setting; did you mean 'n_rollouts'?")
    assert "Traceback" not in err


def test_task_defaults_fill_fields_a_task_lacks(tmp_path: Path) -> None:
    raw = {"model": {"tiny": {"words_from_tasks": True}}, "agent": "python a.py", "tasks_per_step": 1,
           "tasks": [{"id": "a", "question": "x y"}, {"id": "b", "question": "z", "max_tries": 3}],
           "task_defaults": {"max_tries": 1}, "output_dir": str(tmp_path / "run")}
    trainer = build_trainer(raw, base=tmp_path)
    assert [t["max_tries"] for t in trainer.tasks] == [1, 3]


def test_cli_reports_a_yaml_syntax_error_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "train.yaml"  # line 3: an unquoted ': ' in a value, the commonest slip
    config.write_text("model: m\nagent: python a.py\ntasks: [{id: a, question: what is: 3}]\n")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"spanrl: error: config: {config}:3:34: not valid YAML: expected ',' or '}}', but got ':' (while parsing a "
        "flow mapping); fix that line (a value holding ': ' or ' #' needs quotes)"]
    assert main(["train", "--online", str(config)]) == 2  # the online config is read the same way
    assert capsys.readouterr().err.startswith(f"spanrl: error: config: {config}:3:34: not valid YAML")


def test_cli_names_the_task_formats_for_a_csv_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tasks.csv").write_text("id,question\na,1 add 2\n")
    config = tmp_path / "train.yaml"
    config.write_text(f"model: m\nagent: python a.py\ntasks: tasks.csv\noutput_dir: {tmp_path / 'run'}\n")
    assert main(["train", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"spanrl: error: tasks: {str(tmp_path / 'tasks.csv')!r} is a .csv file; tasks come as .jsonl (one JSON object "
        "a line), .json (a JSON list) or a list in the config itself"]
    (tmp_path / "tasks.json").write_text('[{"id": "a"},]')
    with pytest.raises(ConfigError, match=r"tasks: .*tasks.json is not JSON \(Expecting value: line 1 column 14"):
        build_trainer({"model": "m", "agent": "python a.py", "tasks": "tasks.json"}, base=tmp_path)


@pytest.mark.parametrize("error, status", [(ConfigError("bad field"), 2), (ServingError("server gone"), 1),
                                           (StoreUnavailableError("no collector"), 1), (TrainingError("stuck"), 1)])
def test_train_and_train_online_end_on_an_error_with_its_own_exit_status(
        error: Exception, status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # one rule for every spanrl command (errors.cli_error): 2 for bad input, 1 for a run that failed
    def fail(*_: Any, **__: Any) -> Any:
        raise error

    monkeypatch.setattr("spanrl.trainer._cli.build_trainer", fail)
    monkeypatch.setattr("spanrl.online._cli.build_online_trainer", fail)
    config = tmp_path / "train.yaml"
    config.write_text(f"model: m\noutput_dir: {tmp_path / 'run'}\n")
    for online in ([], ["--online"]):
        assert main(["train", *online, str(config)]) == status, online
        assert capsys.readouterr().err.splitlines() == [f"spanrl: error: {error}"]


def test_train_help_names_online_only_in_the_online_option(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer/ knows nothing of the online room above it: what --max-steps and --json mean online is said in
    --online's own help, which online/_cli.py registers."""
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    lines = capsys.readouterr().out.splitlines()
    online = [line for line in lines if line.strip().startswith("--online")]
    assert len(online) == 1 and "--max-steps then overrides max_updates" in online[0]
    assert "updates_this_run" in online[0]
    others = [line for line in lines if line.strip().startswith(("--max-steps", "--json"))]
    assert len(others) == 2 and not any("online" in line for line in others)
