"""What a communication engine is like, as the schedulers see it: one declared model.

Every transport carries ``EngineTraits`` from its construction (a real backend, the simulator's
network, a test's link), and the schedulers read their rules from them; nothing is patched onto a
scheduler afterwards. ``byteps-prophet calibrate`` measures the traits of a real cluster and writes
them as an *engine profile* (JSON, schema below); ``byteps-prophet simulate --engine FILE`` gives the
simulator the same traits, so every rule Prophet has on a real engine also runs there.

Engine profile, version 1::

    {"schema": "byteps-prophet/engine/1",
     "traits": {"name": "byteps", "stages": 2, "pulls_follow_pushes": true, "message_cost_s": 0.0004,
                "startup_latency_s": 0.006, "atom_elements": 250000, "duplex": true, "servers": 1,
                "compute_slowdown": 1.1, "bandwidth_bytes_per_s": 23000000.0, "backpressure": true,
                "duplex_efficiency": 0.93, "pull_in_reply": false, "comm_slowdown": 1.2},
     "measured": {...}}   # optional: the calibration's raw samples and setup, kept for the record

Unknown keys in ``traits`` are an error (a typo would silently keep a default). A trait added later
(``backpressure``, ``duplex_efficiency``, ``pull_in_reply``, ``comm_slowdown``) takes its default when a file lacks it, so older profiles stay loadable.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from byteps_prophet.errors import ConfigError

SCHEMA = "byteps-prophet/engine/1"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, name: str, value, valid: str) -> None:
    if not ok:
        raise ConfigError(f"trait {name}={value!r} is invalid; valid: {valid}")


@dataclasses.dataclass(frozen=True)
class EngineTraits:
    name: str = "ideal"
    # How often each byte crosses the bottleneck link in turn: 2 for a parameter server's push then
    # pull, 1 for an all-reduce.
    stages: int = 1
    # A pull is requested over the uplink only once its push is acknowledged, so the request queues
    # behind every byte pushed before then (BytePS, MXNet's dist KVStore).
    pulls_follow_pushes: bool = False
    # Seconds each message costs on each link besides its bytes (engine and kernel work per message).
    message_cost_s: float = 0.0
    # Seconds from sending an op to its bytes reaching the link (threads to wake, every rank to join);
    # ops already in flight overlap it.
    startup_latency_s: float = 0.0
    # The engine sends a gradient as fixed slices of about this many elements, each its own key
    # (0: any slice costs the same). Prophet cuts on the same grid.
    atom_elements: int = 0
    # Whether a link carries both directions at full rate at once (False: push and pull share it).
    duplex: bool = True
    # Parameter servers the workers share (0: as many as workers). Each server's link carries
    # ``workers / servers`` times what one worker's link carries.
    servers: int = 0
    # Compute time x this while the engine has bytes in flight (its threads share the cores).
    compute_slowdown: float = 1.0
    # And the other way round: bytes move at the link's rate / this while the worker computes (the
    # engine's threads, and the reductions of an all-reduce, get the cores the training leaves).
    comm_slowdown: float = 1.0
    # The link's rate as measured by calibration (0: not measured; take the cluster's nominal rate).
    bandwidth_bytes_per_s: float = 0.0
    # A worker's pushes leave its queue only as fast as the server's ingress, shared by the workers it
    # serves, takes them (TCP back-pressure through one connection), so a pull request queued behind
    # them waits until the server has them all, not until the worker's own link is through with them.
    backpressure: bool = False
    # Each direction of a server's link runs at this share of its rate while the other direction is
    # busy too (the acknowledgements of one direction's TCP stream travel in the other, the engine's
    # threads serve both); 1: both directions at full rate at once. Only where ``duplex``.
    duplex_efficiency: float = 1.0
    # The server answers each push with the key's merged values as soon as every worker pushed it: one
    # request per key (MXNet's dist ``pushpull``, one ps-lite request), so no pull request is sent and
    # none queues on the uplink behind later pushes; the pull leaves the server while later pushes
    # still arrive. The schedulers still see ``pulls_follow_pushes`` (a key's values come back only
    # after its push): this trait is the network's, not a scheduling rule. Only where ``stages`` is 2.
    pull_in_reply: bool = False

    def __post_init__(self) -> None:
        _check(self.stages in (1, 2), "stages", self.stages, "1 (all-reduce) or 2 (push then pull)")
        _check(not (self.pulls_follow_pushes and self.stages != 2), "pulls_follow_pushes",
               self.pulls_follow_pushes, "false unless stages is 2")
        for name in ("message_cost_s", "startup_latency_s", "bandwidth_bytes_per_s"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, name, value,
                   "a finite number >= 0")
        _check(_is_int(self.atom_elements) and self.atom_elements >= 0, "atom_elements", self.atom_elements,
               "an integer >= 0 (elements; 0 = no atoms)")
        _check(_is_int(self.servers) and self.servers >= 0, "servers", self.servers,
               "an integer >= 0 (0 = as many as workers)")
        for name in ("compute_slowdown", "comm_slowdown"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value < 10, name, value,
                   "a number in [1, 10)")
        _check(isinstance(self.duplex, bool), "duplex", self.duplex, "true or false")
        _check(isinstance(self.backpressure, bool), "backpressure", self.backpressure, "true or false")
        _check(isinstance(self.duplex_efficiency, (int, float)) and not isinstance(self.duplex_efficiency, bool)
               and 0.5 <= self.duplex_efficiency <= 1, "duplex_efficiency", self.duplex_efficiency,
               "a number in [0.5, 1] (1 = both directions at full rate at once)")
        _check(not (self.backpressure and self.stages != 2), "backpressure", self.backpressure,
               "false unless stages is 2")
        _check(isinstance(self.pull_in_reply, bool), "pull_in_reply", self.pull_in_reply, "true or false")
        _check(not (self.pull_in_reply and self.stages != 2), "pull_in_reply", self.pull_in_reply,
               "false unless stages is 2")

    @property
    def is_parameter_server(self) -> bool:
        return self.stages == 2

    def replace(self, **changes) -> "EngineTraits":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "engine traits") -> "EngineTraits":
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: 'traits' is not an object; valid: an object of trait names")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown trait {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None


# Built-in engine descriptions (docs/ENGINE.md); `byteps-prophet calibrate` measures a real engine's.
PRESETS: dict[str, EngineTraits] = {
    "ideal": EngineTraits(),
    "ideal-ps": EngineTraits(name="ideal-ps", stages=2),
    "gloo": EngineTraits(name="gloo", stages=1, message_cost_s=0.005),
    "byteps": EngineTraits(name="byteps", stages=2, pulls_follow_pushes=True, atom_elements=250_000),
    "kvstore": EngineTraits(name="kvstore", stages=2, pulls_follow_pushes=True, atom_elements=250_000),
}


def engine_document(traits: EngineTraits, measured: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": SCHEMA, "traits": traits.to_dict()}
    if measured:
        out["measured"] = dict(measured)
    return out


def save_engine(path: str, traits: EngineTraits, measured: Mapping[str, Any] | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(engine_document(traits, measured), f, indent=1)
        f.write("\n")


def load_engine(path: str) -> EngineTraits:
    """The traits of an engine profile file, or a preset's name; a one-line ConfigError otherwise."""
    if path in PRESETS:
        return PRESETS[path]
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"engine profile {path!r} does not exist; valid: a file written by "
                          f"`byteps-prophet calibrate`, or one of {', '.join(PRESETS)}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"engine profile {path!r} is not readable JSON ({err})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"engine profile {path!r}: schema {got!r} is not supported; valid: {SCHEMA!r}")
    if "traits" not in data:
        raise ConfigError(f"engine profile {path!r}: no 'traits' object")
    return EngineTraits.from_dict(data["traits"], f"engine profile {path!r}")

