"""One configuration: every Settings field has one variable, read by ``from_env``, listed in the README."""
import dataclasses
import re
from pathlib import Path

import pytest

from byteps_prophet.cluster.container import VARIABLES, container
from byteps_prophet import cli
from byteps_prophet.core.settings import (DECLARATIONS, ENVIRONMENT, PATHS, README_END, README_START, RENAMED,
                                          Settings, readme_region, settings_help, with_settings_table)
from byteps_prophet.errors import ConfigError

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_table(heading: str) -> set[str]:
    """The variables each item of the list under ``heading`` names before its first colon."""
    text = README.read_text().split(f"\n{heading}\n", 1)[1]
    items = [line for line in text.split("\n#", 1)[0].splitlines() if line.startswith("- `")]
    return {name for line in items for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("(default")[0])}


def test_every_field_has_one_variable_listed_in_the_readme_table():
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(ENVIRONMENT) == fields
    names = [name for name, _ in ENVIRONMENT.values()]
    assert len(set(names)) == len(names)
    assert set(names) == _readme_table("## Settings"), set(names) ^ _readme_table("## Settings")


def test_every_container_variable_is_listed_in_its_readme_table():
    names = [name for name, *_ in VARIABLES.values()]
    assert len(set(names)) == len(names) and not set(names) & {n for n, _ in ENVIRONMENT.values()}
    assert set(names) == _readme_table("### Cluster containers"), set(names) ^ _readme_table("### Cluster containers")


@pytest.mark.parametrize("field", sorted(VARIABLES))
def test_each_container_variable_is_read_and_checked(field):
    name, default, *_ = VARIABLES[field]
    other = {"engine": "mxnet", "link_bandwidth": "200mbit", "link_latency": "1ms", "link_device": "eth1",
             "link_shaping": "0", "selftest_sizes": "5", "selftest_framework": "mxnet", "train_model": "mlp",
             "train_command": "python -m x", "host": "h", "coordinator": "c", "coordinator_address": "a"}
    assert getattr(container({name: other.get(field, "7")}), field) != getattr(container({}), field)
    if field not in ("link_device", "train_model", "train_command", "host", "coordinator", "coordinator_address"):
        with pytest.raises(ConfigError) as err:
            container({name: "-1x"})
        assert str(err.value).startswith(f"{name}='-1x' is invalid; valid: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("field", sorted(ENVIRONMENT))
def test_each_variable_is_read(field):
    """Setting a variable changes its field (so a renamed or dropped read fails here)."""
    name, _ = ENVIRONMENT[field]
    default = getattr(Settings(), field)
    names = {"scheduler": "prophet", "prophet_mode": "paper", "link_monitor": "core", "backend": "gloo",
             "trace": "/tmp/Trace-{rank}.json", "profile": "/tmp/P.json", "socket_path": "/tmp/S"}
    other = {bool: "0" if default else "1", str: names.get(field), int: "7", float: "3.5"}[type(default)]
    if field in ("partition", "credit", "profile_iterations"):
        other = "7"
    assert getattr(Settings.from_env({name: other}), field) != default


@pytest.mark.parametrize("field", sorted(f for f in ENVIRONMENT if f not in ("credit_tuning", *PATHS)))
def test_a_bad_value_is_one_line_naming_the_variable(field):
    name, _ = ENVIRONMENT[field]
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: "-1x"})
    assert name in str(err.value) and "valid:" in str(err.value) and "\n" not in str(err.value)


def test_a_path_is_kept_as_written():
    assert Settings.from_env({"BYTEPS_PROPHET_TRACE": " /tmp/Run-{rank}.JSON "}).trace == "/tmp/Run-{rank}.JSON"


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_name_still_works_with_a_warning(old):
    new = RENAMED[old]
    field = next(f for f, (name, _) in ENVIRONMENT.items() if name == new)
    value = "/tmp/t.json" if field in PATHS else "7"
    with pytest.warns(FutureWarning, match=f"{old} is renamed {new}"):
        got = Settings.from_env({old: value})
    assert str(getattr(got, field)) == value
    with pytest.warns(FutureWarning):  # the new name wins when both are set
        assert str(getattr(Settings.from_env({old: value, new: "9"}), field)) == "9"


def test_the_readme_table_is_the_generated_one():
    """README's settings table is generated (``byteps-prophet settings --write-readme README.md``)."""
    text = README.read_text()
    region = text[text.index(README_START):text.index(README_END) + len(README_END)]
    assert region == readme_region(), "run: byteps-prophet settings --write-readme README.md"
    assert with_settings_table(text) == text


def test_the_list_has_one_item_per_setting_and_no_line_over_120_characters():
    lines = readme_region().split("\n")[1:-1]
    listed = lines[:lines.index("")]
    items = [line for line in listed if line.startswith("- `")]
    assert len(items) == len(DECLARATIONS) and all(line.startswith(("- `", "  ")) for line in listed)
    assert max(len(line) for line in lines) <= 120


def test_regenerating_replaces_only_the_region():
    stale = f"before\n{README_START}\n| old |\n{README_END}\nafter\n"
    assert with_settings_table(stale) == f"before\n{readme_region()}\nafter\n"
    with pytest.raises(ConfigError, match="settings-table"):
        with_settings_table("no markers")


def test_settings_command_lists_every_setting(capsys):
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    assert all(d.variable in out and d.valid in out for d in DECLARATIONS.values())
    assert cli.main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out in readme_region()


def test_settings_command_rewrites_a_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_START}\n{README_END}\n")
    assert cli.main(["settings", "--write-readme", str(readme)]) == 0
    assert readme.read_text() == f"# x\n{readme_region()}\n"


def test_help_names_the_variables_and_defaults():
    text = settings_help(["partition", "prophet_mode"])
    assert "BYTESCHEDULER_PARTITION=1000000" in text and "PROPHET_MODE=default" in text and "\n" not in text


def test_a_partition_changes_no_other_setting():
    """BYTESCHEDULER_PARTITION is ByteScheduler's partition only: Prophet's stays its own setting."""
    got = Settings.from_env({"BYTESCHEDULER_PARTITION": "500"})
    assert got.partition == 500 and got.prophet_partition == Settings().prophet_partition
    got = Settings.from_env({"BYTESCHEDULER_PARTITION": "500", "BYTEPS_PROPHET_PARTITION": "123"})
    assert (got.partition, got.prophet_partition) == (500, 123)


@pytest.mark.parametrize("field", sorted(ENVIRONMENT))
def test_setting_one_variable_changes_one_field(field):
    name, _ = ENVIRONMENT[field]
    value = {"scheduler": "prophet", "prophet_mode": "paper", "link_monitor": "core", "backend": "gloo"}.get(
        field, "/tmp/x" if field in PATHS else "1" if isinstance(getattr(Settings(), field), bool) else "7")
    if isinstance(getattr(Settings(), field), bool) and getattr(Settings(), field):
        value = "0"
    got, default = Settings.from_env({name: value}), Settings()
    changed = [f for f in ENVIRONMENT if getattr(got, f) != getattr(default, f)]
    assert changed == [field]


def test_an_invalid_override_names_the_keyword():
    with pytest.raises(ConfigError) as err:
        Settings.from_env({}, overrides={"credit": -5})
    assert str(err.value) == "credit=-5 is invalid; valid: a positive integer (elements)"
    with pytest.raises(ConfigError) as err:
        Settings.from_env({}, overrides={"scheduler": "lifo"})
    assert str(err.value) == "scheduler='lifo' is not a scheduler; valid: fifo, bytescheduler, prophet"
    with pytest.raises(ConfigError, match="^partition='big' is invalid; valid: "):
        Settings.from_env({}, overrides={"partition": "big"})
    with pytest.raises(ConfigError, match="^overlap='yes' is invalid; valid: 0, 1$"):
        Settings.from_env({}, overrides={"overlap": "yes"})
    assert Settings.from_env({"BYTESCHEDULER_CREDIT": "-5"}, overrides={"credit": 7}).credit == 7
    assert Settings.from_env({}, overrides={"timeout": 5, "overlap": True, "trace": "/tmp/T.json"}).timeout == 5


def test_an_invalid_variable_still_names_the_variable():
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"BYTESCHEDULER_CREDIT": "-5"})
    assert str(err.value) == "BYTESCHEDULER_CREDIT=-5 is invalid; valid: a positive integer (elements)"
    with pytest.raises(ConfigError) as err:
        Settings(scheduler="lifo")
    assert str(err.value) == "BYTEPS_SCHEDULER='lifo' is not a scheduler; valid: fifo, bytescheduler, prophet"
