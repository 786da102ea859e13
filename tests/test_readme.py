from harness.cases import ROOT


def _commands(text):
    return [line for line in text.splitlines() if line.startswith("python3 -m venv")]


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    run_command, test_command = _commands(readme)[:2]
    assert "python -m harness case=" in run_command
    assert test_command.endswith("python -m pytest")
    assert test_command in (ROOT / ".ci" / "run").read_text()
