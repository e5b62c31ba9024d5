"""The compose file is the one cluster definition: reading it, interpolation, its contract."""
import shutil
import subprocess
import textwrap

import pytest
import yaml

from byteps_prophet.cluster.compose import default_compose_path, interpolate, load_compose, parse_compose
from byteps_prophet.errors import ConfigError

REPO_COMPOSE = default_compose_path()


def test_repo_compose_defines_scheduler_server_and_two_workers():
    definition = load_compose(environ={})
    assert definition.scheduler.name == "scheduler"
    assert [s.name for s in definition.servers] == ["server-0"]
    assert [w.name for w in definition.workers] == ["worker-0", "worker-1"]
    for service in (definition.scheduler, *definition.servers):
        assert service.command == ("python", "-m", "byteps_prophet.cluster.serve")
    for service in definition.workers:
        assert service.command == ("python", "-m", "byteps_prophet.cluster.selftest")
    env = definition.workers[1].environment
    assert env["DMLC_ROLE"] == "worker" and env["DMLC_WORKER_ID"] == "1"
    assert env["ENGINE"] == "byteps"
    assert env["LINK_BANDWIDTH"] == "1gbit" and env["LINK_LATENCY"] == "0ms"
    assert env["BYTEPS_LOCAL_SIZE"] == "1" and env["BYTEPS_CPU_ONLY"] == "1"
    assert "BYTEPS_SCHEDULER" not in env  # pass-through key, caller has none


def test_repo_compose_takes_the_callers_knobs_and_defaults():
    caller = {"ENGINE": "mxnet", "BYTEPS_SCHEDULER": "prophet", "LINK_BANDWIDTH": "200mbit",
              "PROPHET_MODE": "paper"}
    env = load_compose(environ=caller).workers[0].environment
    assert env["ENGINE"] == "mxnet"
    assert env["BYTEPS_SCHEDULER"] == "prophet"
    assert env["PROPHET_MODE"] == "paper"
    assert env["LINK_BANDWIDTH"] == "200mbit"


def test_repo_compose_passes_docker_compose_config():
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose binary not installed (apt-get install docker-compose)")
    proc = subprocess.run([binary, "-f", str(REPO_COMPOSE), "config", "-q"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("text, env, expected", [
    ("${A}", {"A": "1"}, "1"),
    ("${A:-x}", {}, "x"),
    ("${A:-x}", {"A": ""}, "x"),
    ("${A-x}", {"A": ""}, ""),
    ("${A-x}", {}, "x"),
    ("$A/$B", {"A": "a", "B": "b"}, "a/b"),
    ("cost $$5", {}, "cost $5"),
    ("${MISSING}", {}, ""),
    ("${A:-$B}", {"B": "nested"}, "nested"),
])
def test_interpolation(text, env, expected):
    assert interpolate(text, env) == expected


def test_interpolation_errors():
    with pytest.raises(ConfigError, match="required variable A is not set: give A"):
        interpolate("${A:?give A}", {})
    with pytest.raises(ConfigError, match="invalid interpolation"):
        interpolate("price $", {})


def _doc(text):
    return yaml.safe_load(textwrap.dedent(text))


def test_list_environment_string_command_and_template_repetition():
    definition = parse_compose(_doc("""
        services:
          sched:
            environment: [DMLC_ROLE=scheduler, "PORT=${P:-7}", KEEP]
          ps:
            environment: {DMLC_ROLE: server}
            command: python -c 'import mxnet'
          w:
            environment: {DMLC_ROLE: worker, X: 1, Y: true}
            command: [python, train.py, --lr, 0.1]
          redis:
            image: redis
    """), environ={"KEEP": "kept"})
    assert definition.scheduler.environment == {"DMLC_ROLE": "scheduler", "PORT": "7", "KEEP": "kept"}
    assert definition.servers[0].command == ("python", "-c", "import mxnet")
    assert definition.workers[0].command == ("python", "train.py", "--lr", "0.1")
    assert definition.workers[0].environment["X"] == "1"
    assert definition.workers[0].environment["Y"] == "true"
    assert definition.template("worker", 5).name == "w"  # the last one repeats
    assert definition.scheduler.command is None


@pytest.mark.parametrize("text, fragment", [
    ("{}", "no 'services' mapping"),
    ("services: {a: {environment: {DMLC_ROLE: server}}, b: {environment: {DMLC_ROLE: worker}}}",
     "exactly one service with DMLC_ROLE=scheduler (found: none)"),
    ("services: {a: {environment: {DMLC_ROLE: scheduler}}, b: {environment: {DMLC_ROLE: worker}}}",
     "at least one service with DMLC_ROLE=server"),
    ("services: {a: {environment: {DMLC_ROLE: boss}}}", "DMLC_ROLE='boss' is not a role; valid: scheduler, server, worker"),
    ("services: {a: {environment: {DMLC_ROLE: scheduler}, command: 5}}", "command must be a list or a string"),
    ("services: {a: {environment: {DMLC_ROLE: scheduler, X: [1]}}}", "must be a string, number or boolean"),
    ("services: {a: {environment: 5}}", "environment must be a mapping"),
])
def test_contract_errors(text, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_compose(_doc(text), environ={})


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        load_compose(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("services: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_compose(bad)


def test_without_a_source_checkout_the_compose_file_is_looked_for_under_the_cwd(tmp_path):
    """An installed (non-editable) package has no docker/ beside it: the current directory's is
    used, and without one the error says in one line where it must be."""
    from byteps_prophet.cluster.compose import COMPOSE_FILE
    from byteps_prophet.errors import ConfigError

    installed, cwd = tmp_path / "site-packages", tmp_path / "work"
    installed.mkdir(), cwd.mkdir()
    with pytest.raises(ConfigError) as err:
        default_compose_path(source_root=installed, cwd=cwd)
    message = str(err.value)
    assert "\n" not in message and "docker/docker-compose.yml" in message and str(cwd) in message
    (cwd / COMPOSE_FILE).parent.mkdir()
    (cwd / COMPOSE_FILE).write_text(REPO_COMPOSE.read_text())
    assert default_compose_path(source_root=installed, cwd=cwd) == cwd / COMPOSE_FILE
