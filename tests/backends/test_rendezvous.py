"""One reader for where a process sits in the job: both launchers' dialects, and a one-line error
naming the variable for a bad value, raised only where the value is used."""
import pytest

from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.errors import ConfigError


def test_torch_names_win_over_byteps_names_and_defaults_are_one_worker():
    assert rendezvous({"RANK": "1", "WORLD_SIZE": "3", "DMLC_WORKER_ID": "0",
                       "DMLC_NUM_WORKER": "2"}).rank_and_size() == (1, 3)
    assert rendezvous({"DMLC_WORKER_ID": "1", "DMLC_NUM_WORKER": "2"}).rank_and_size() == (1, 2)
    assert rendezvous({}).rank_and_size() == (0, 1)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'/WORLD_SIZE='2' are not integers"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
])
def test_a_bad_rank_is_a_one_line_error_when_used(env, message):
    where = rendezvous(env)  # reading never fails: a run that does not need RANK is not stopped by it
    with pytest.raises(ConfigError, match=message):
        where.rank_and_size()


def test_worker_id_role_and_world_size():
    where = rendezvous({"DMLC_WORKER_ID": " 1 ", "DMLC_ROLE": "worker", "WORLD_SIZE": "4",
                        "MASTER_ADDR": " 10.0.0.2 "})
    assert (where.worker_id, where.role, where.world_size, where.master_addr) == (1, "worker", 4, "10.0.0.2")
    assert rendezvous({"DMLC_WORKER_ID": "a"}).worker_id is None
    assert rendezvous({}).world_size == 1 and rendezvous({}).master_addr == ""


def test_server_and_worker_counts_and_gloos_interface():
    where = rendezvous({"DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3", "GLOO_SOCKET_IFNAME": " eth1 "})
    assert (where.num_servers(), where.num_workers(), where.gloo_interface) == (2, 3, "eth1")
    assert (rendezvous({}).num_servers(), rendezvous({}).num_servers(1), rendezvous({}).num_workers()) == (0, 1, 1)
    with pytest.raises(ConfigError, match="DMLC_NUM_SERVER='two' is invalid; valid: an integer >= 0"):
        rendezvous({"DMLC_NUM_SERVER": "two"}).num_servers()
