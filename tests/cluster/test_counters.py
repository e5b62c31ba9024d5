"""Link and TCP counters of the local cluster: parsing and differences (no root needed)."""
from byteps_prophet.ab.runner import network_summary
from byteps_prophet.cluster import netns

SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 10
Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs
Tcp: 1 200 5000 7
TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes TCPFastRetrans
TcpExt: 0 2 3 4
"""


def test_proc_net_counters_are_read_by_group_and_name():
    assert netns.parse_proc_net(SNMP) == {"out_segs": 5000, "retrans_segs": 7, "timeouts": 2,
                                          "loss_probes": 3, "fast_retrans": 4}
    assert netns.parse_proc_net("garbage\nTcp: x\n") == {}


def test_a_runs_summary_is_the_difference_per_host():
    def snap(drops, retrans, nbytes):
        link = {"bytes": nbytes, "packets": 1, "drops": drops, "overlimits": 9, "requeues": 0}
        return {"up": dict(link), "down": dict(link), "tcp": {"out_segs": 100 + nbytes, "retrans_segs": retrans,
                                                              "timeouts": retrans // 2}}
    before = {"scheduler": snap(0, 0, 10), "worker-0": snap(1, 2, 10)}
    after = {"scheduler": snap(0, 0, 50), "worker-0": snap(4, 8, 1010)}
    out = network_summary(before, after)
    assert list(out) == ["scheduler", "worker-0"]
    assert out["scheduler"]["up_bytes"] == 40 and out["scheduler"]["tcp_retrans_segs"] == 0
    row = out["worker-0"]
    assert row["up_drops"] == 3 and row["down_drops"] == 3 and row["up_bytes"] == 1000
    assert row["tcp_retrans_segs"] == 6 and row["tcp_timeouts"] == 3 and row["tcp_out_segs"] == 1000
    assert network_summary({}, {}) == {}
