"""The A/B's report: per variant its median samples/s, per pair of variants the median of their
per-round ratios with its interval (stats.py), the limit a schedule can reach here, the table, the
plot, and the pooling of several runs' outputs."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict

from byteps_prophet.ab.runner import (
    BYTEPS_STOCK, COMM_ONLY, COMPUTE_ONLY, DDP, DDP_TUNED, REFERENCES, ABConfig,
)
from byteps_prophet.ab.stats import LEVEL, paired_ratios, speedup
from byteps_prophet.errors import UserError


PAIRS = (("prophet", "fifo"), ("prophet", "bytescheduler"), ("prophet", "bytescheduler_tuned"),
         ("bytescheduler", "fifo"), ("bytescheduler_tuned", "fifo"),
         # against what a torch user runs instead (BASELINES)
         ("prophet", DDP), ("prophet", DDP_TUNED), ("fifo", DDP), ("bytescheduler", DDP),
         ("bytescheduler_tuned", DDP), (DDP_TUNED, DDP), ("prophet", BYTEPS_STOCK), ("fifo", BYTEPS_STOCK),
         ("bytescheduler", BYTEPS_STOCK),
         ("prophet_fused", "prophet_unfused"), ("prophet_fused", "prophet"), ("prophet_fused", DDP),
         ("prophet_unfused", DDP), ("prophet_fused", DDP_TUNED), ("prophet_unfused", DDP_TUNED),
         ("prophet_overlap", "prophet"), ("bytescheduler_overlap", "bytescheduler"),
         ("prophet_overlap", "bytescheduler_overlap"))


def summarize(cfg: ABConfig, runs: list[dict], *, netns: bool | None, environment: dict, tuning: dict | None,
              warnings: list[str], ddp_tuning: dict | None = None, tcp_congestion: str | None = None) -> dict:
    """The A/B's JSON object: per variant its median samples/s and spread, per pair of variants the
    median of their per-round ratios with its interval (stats.py), and the limit."""
    results = {}
    for variant in dict.fromkeys(run["variant"] for run in runs):
        rates = [run["samples_per_s"] for run in runs if run["variant"] == variant]
        results[variant] = {"samples_per_s": statistics.median(rates), "spread": max(rates) - min(rates),
                            "min": min(rates), "max": max(rates), "runs": rates}
    speedups = {}
    for a, b in PAIRS:
        ratios = paired_ratios(runs, a, b)
        if ratios:
            speedups[f"{a}/{b}"] = speedup(ratios, results[a]["samples_per_s"] / results[b]["samples_per_s"])
    config = asdict(cfg)
    config["variants"] = list(config["variants"])
    bound, defects = limit(cfg, runs, results, netns)
    warnings = list(dict.fromkeys([*warnings, *defects]))  # a pooled output's defects are found again
    out = {"config": config, "environment": environment, "netns": netns, "tcp_congestion_control": tcp_congestion,
           "results": results, "speedups": speedups, "limit": bound,
           "tuning": tuning, "warnings": warnings, "runs": runs}
    if ddp_tuning is not None:
        out["ddp_tuning"] = ddp_tuning
    return out


def limit(cfg: ABConfig, runs: list[dict], results: dict, netns: bool | None) -> tuple[dict | None, list[str]]:
    """The most samples/s any schedule can reach here (docs/ALGORITHMS.md, "4. The limit"), and the
    defects it shows. The limit is the least of the true upper bounds measured: compute alone (the
    compute_only runs' median; no schedule computes faster than with no communication) and the
    busiest link's bytes per step at the link's shaped rate (no protocol overhead; left out under a
    bandwidth schedule or without shaping). comm_only is no bound: it is the engine's unscheduled
    synchronisation, which a schedule that cuts tensors and overlaps push and pull can pass; it is a
    reference among the results. A variant above the limit means a bound was wrong: a defect of the
    tool, said in the warnings, never a share."""
    found: dict = {}
    if COMPUTE_ONLY in results:
        found["compute_samples_per_s"] = results[COMPUTE_ONLY]["samples_per_s"]
    model_bytes = next((run["param_bytes"] for run in runs if run.get("param_bytes")), None)
    if model_bytes and not cfg.bandwidth_schedule and netns:
        from byteps_prophet.units import parse_bandwidth

        found["link_bytes_per_step"] = link_bytes_per_step(cfg, model_bytes)
        step_s = found["link_bytes_per_step"] * 8 / parse_bandwidth(cfg.bandwidth)
        found["link_samples_per_s"] = cfg.workers * cfg.batch / step_s
    if not found:
        return None, []
    found["samples_per_s"] = min(found[key] for key in BOUNDS if key in found)
    shares = {name: res["samples_per_s"] / found["samples_per_s"]
              for name, res in results.items() if name not in REFERENCES}
    found["share"] = {name: share for name, share in shares.items() if share <= 1.0}
    defects = [f"{LIMIT_DEFECT} {name} ran {results[name]['samples_per_s']:.2f} samples/s, {share:.0%} of the "
               f"limit {found['samples_per_s']:.2f} ({describe_bounds(found)}): a bound it passes is not a bound, "
               f"so this limit is wrong here and no share of it is reported"
               for name, share in shares.items() if share > 1.0]
    return found, defects


# The limit's true upper bounds, by their keys in the limit's JSON.
BOUNDS = ("compute_samples_per_s", "link_samples_per_s")
# How a warning that a variant passed the limit begins (the table prints those after the limit).
LIMIT_DEFECT = "limit defect:"


def describe_bounds(limit: dict) -> str:
    parts = []
    if "compute_samples_per_s" in limit:
        parts.append(f"compute alone {limit['compute_samples_per_s']:.2f}")
    if "link_samples_per_s" in limit:
        parts.append(f"link {limit['link_samples_per_s']:.2f} ({limit['link_bytes_per_step'] / 1e6:.3g} MB per step "
                     f"on the busiest link)")
    return "; ".join(parts)


# What must agree for rounds of several A/Bs to be pooled: the experiment, not how many steps it timed.
POOLED_CONFIG = ("framework", "backend", "model", "workers", "bandwidth", "bandwidth_schedule", "warmup",
                 "batch", "width", "threads")


def pool(paths: list[str]) -> dict:
    """One summary of the rounds of several ``ab --json`` outputs of the same configuration and
    environment (each file's rounds stay paired within themselves)."""
    loaded = []
    for path in paths:
        try:
            with open(path) as f:
                summary = json.load(f)
            config, runs = summary["config"], summary["runs"]
        except OSError as err:
            raise UserError(f"--pool {path}: cannot read it ({err.strerror})") from None
        except (ValueError, KeyError, TypeError):
            raise UserError(f"--pool {path}: not the JSON of `byteps-prophet ab --json`") from None
        loaded.append((path, summary, config, runs))
    first_path, first, first_config, _ = loaded[0]
    for path, summary, config, _ in loaded[1:]:
        for key in POOLED_CONFIG:
            if config.get(key) != first_config.get(key):
                raise UserError(f"--pool {path}: {key} {config.get(key)!r} differs from {first_path}'s "
                                f"{first_config.get(key)!r}; valid: outputs of the same configuration")
        if summary.get("environment") != first.get("environment"):
            raise UserError(f"--pool {path}: its environment {summary.get('environment')} differs from "
                            f"{first_path}'s {first.get('environment')}; valid: outputs run with the same knobs")
    runs, offset, sources = [], 0, []
    for path, summary, _, file_runs in loaded:
        rounds = sorted({run["round"] for run in file_runs})
        renumber = {r: offset + k for k, r in enumerate(rounds)}
        runs += [dict(run, round=renumber[run["round"]]) for run in file_runs]
        offset += len(rounds)
        sources.append({"path": path, "rounds": len(rounds), "steps": summary["config"].get("steps"),
                        "tuning": summary.get("tuning"), "ddp_tuning": summary.get("ddp_tuning")})
    fields = ABConfig.__dataclass_fields__
    cfg = ABConfig(**{k: v for k, v in first_config.items() if k in fields})
    cfg.variants = tuple(dict.fromkeys(run["variant"] for run in runs))
    cfg.rounds = offset
    netns = all(summary.get("netns") for _, summary, _, _ in loaded)
    warnings = list(dict.fromkeys(w for _, summary, _, _ in loaded for w in summary.get("warnings", [])))
    used = {summary.get("tcp_congestion_control") for _, summary, _, _ in loaded}
    if len(used) > 1:
        raise UserError(f"--pool: the outputs ran under different TCP congestion controls "
                        f"({', '.join(sorted(u or 'unknown' for u in used))}); valid: outputs of one")
    out = summarize(cfg, runs, netns=netns, environment=first.get("environment", {}), tuning=None,
                    warnings=warnings, tcp_congestion=used.pop())
    out["pooled_from"] = sources  # each output's tuned credit is its own
    return out


def link_bytes_per_step(cfg: ABConfig, model_bytes: int) -> float:
    """Bytes the busiest link carries in each direction per step: a ring all-reduce moves
    2(n-1)/n of the model over every worker's link; the one parameter server's link carries every
    worker's push in and every pull out."""
    if cfg.backend == "gloo":
        return 2 * (cfg.workers - 1) / cfg.workers * model_bytes
    return cfg.workers * model_bytes


def format_table(summary: dict) -> str:
    cfg = summary["config"]
    head = (f"A/B {cfg['framework']}/{cfg['backend']} {cfg['model']} x{cfg['workers']} workers, batch {cfg['batch']}, "
            f"{cfg['bandwidth']}" + (f" -> {' -> '.join(cfg['bandwidth_schedule'])}" if cfg["bandwidth_schedule"] else "")
            + f", {cfg['steps']} steps x {cfg['rounds']} rounds" + ("" if summary.get("netns") else " (LOOPBACK, unshaped)")
            + (f", TCP {summary['tcp_congestion_control']}" if summary.get("tcp_congestion_control") else ""))
    lines = [head]
    if summary.get("pooled_from"):
        lines.append("pooled: " + ", ".join(f"{src['path']} ({src['rounds']} rounds of {src['steps']} steps)"
                                            for src in summary["pooled_from"]))
    if summary.get("environment"):
        lines.append("environment: " + " ".join(f"{k}={v}" for k, v in summary["environment"].items()))
    lines += [f"{'scheduler':<22}{'samples/s (median)':>20}{'spread (max-min)':>18}{'vs fifo':>9}"]
    fifo = summary["results"].get("fifo", {}).get("samples_per_s")
    for name, res in summary["results"].items():
        ratio = f"{res['samples_per_s'] / fifo:.3f}x" if fifo else "-"
        lines.append(f"{name:<22}{res['samples_per_s']:>20.2f}{res['spread']:>18.2f}{ratio:>9}")
    if summary.get("tuning"):
        t = summary["tuning"]
        lines.append(f"tuned credit: {t.get('best_credit')} elements ({len(t.get('probes', []))} probes, "
                     f"bounds {t.get('credit_bounds')})")
    if summary.get("ddp_tuning"):
        t = summary["ddp_tuning"]
        sweep = ", ".join(f"{mb:g} MB {s:.3f} s" for mb, s in t.get("probes", []))
        lines.append(f"ddp_tuned bucket: {t.get('best_bucket_mb'):g} MB, the fastest of the sweep "
                     f"(s per step: {sweep}); ddp: DDP's default 25 MB")
    limit = summary.get("limit")
    if limit:
        share = ", ".join(f"{name} {value:.0%}" for name, value in limit["share"].items())
        lines.append(f"limit: {limit['samples_per_s']:.2f} samples/s ({describe_bounds(limit)}); reached: {share or '-'}")
        lines += [f"warning: {w}" for w in summary.get("warnings", []) if w.startswith(LIMIT_DEFECT)]
    for key, s in summary["speedups"].items():
        lines.append(f"speedup {key:<34} median of per-round ratios {s['median']:.3f}x "
                     f"(min {s['min']:.3f}, max {s['max']:.3f}; {describe_interval(s)})")
    return "\n".join(lines)


def describe_interval(pair: dict) -> str:
    """How sure a speedup's median is, in words (stats.py): its interval, and too few rounds said as such."""
    interval, rounds = pair["interval"], pair["rounds"]
    span = f"{interval['low']:.3f}-{interval['high']:.3f}"
    if interval["confidence"] >= LEVEL:
        return f"{LEVEL:.0%} interval {span} over {rounds} rounds"
    return f"the {rounds} rounds' range {span} holds the median with {interval['confidence']:.0%}; 6 rounds give {LEVEL:.0%}"


def plot(summary: dict, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(summary)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure(summary: dict):
    """The A/B's bar chart: each variant's median samples/s with its min-max, and the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["results"])
    med = [summary["results"][n]["samples_per_s"] for n in names]
    lo = [m - summary["results"][n]["min"] for n, m in zip(names, med)]
    hi = [summary["results"][n]["max"] - m for n, m in zip(names, med)]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.25 * len(names)), 4))
    colors = {"fifo": "#888", "bytescheduler": "#59c", "bytescheduler_tuned": "#37a", "prophet": "#d62",
              COMPUTE_ONLY: "#ccc", COMM_ONLY: "#ccc", DDP: "#6a6", DDP_TUNED: "#383", BYTEPS_STOCK: "#aaa"}
    ax.bar(range(len(names)), med, yerr=[lo, hi], capsize=6, color=[colors.get(n, "#888") for n in names])
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])  # long names on two lines
    limit = summary.get("limit")
    if limit:
        ax.axhline(limit["samples_per_s"], color="k", linestyle="--", linewidth=1)
        ax.annotate("limit", (len(names) - 0.5, limit["samples_per_s"]), ha="right", va="bottom", fontsize=8)
    cfg = summary["config"]
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title(f"{cfg['model']} {cfg['framework']}/{cfg['backend']} x{cfg['workers']} @ {cfg['bandwidth']}"
                 + (" -> " + " -> ".join(cfg["bandwidth_schedule"]) if cfg["bandwidth_schedule"] else ""))
    fig.tight_layout()
    return fig
