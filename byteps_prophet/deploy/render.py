"""Render a cluster description for the machines that run it (``byteps-prophet deploy render``).

Targets (docs/DEPLOY.md):

* ``compose``: one compose file per host address, ``compose-<address>.yml``, holding the roles placed
  on that host, each with ``network_mode: host``, so the same image runs across real machines;
  run ``docker-compose -f compose-<address>.yml up`` on each;
* ``k8s``: ``kubernetes.yaml``: the scheduler as a Deployment behind a Service (the address every
  other host connects to), the servers as a StatefulSet with its headless Service, the workers as an
  Indexed Job whose completion index is ``DMLC_WORKER_ID``; CPU, memory and ``nvidia.com/gpu``
  requests from the description;
* ``pods``: ``pods.yaml``: the same roles as plain Pods, each worker's index written out, for
  ``podman kube play`` (which plays Pods but not Jobs, StatefulSets or Services): on a podman network
  a pod's name resolves to its address, so the scheduler pod's name is the scheduler address.

Every role runs ``PYTHON -m byteps_prophet launch`` with the ``DMLC_*`` variables of its place in the
job, so a failed or lost host ends the whole job, naming it (byteps_prophet.deploy.launch).
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from byteps_prophet.cluster.roles import host_name
from byteps_prophet.deploy.description import Description, require_hosts
from byteps_prophet.errors import ConfigError

TARGETS = ("compose", "k8s", "pods")
APP = "byteps-prophet"
ROLE_LABEL = "byteps-prophet/role"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
SHM_SIZE = "1Gi"  # BytePS keeps each worker's push/pull buffers in /dev/shm; 64 MiB is the usual default


def _launcher(description: Description) -> list[str]:
    return [description.python, "-m", "byteps_prophet", "launch"]


def _args(description: Description, role: str, extra: list[str] | None = None) -> list[str]:
    args = list(extra or [])
    if description.control_port != description.port + 1:
        args += ["--control-port", str(description.control_port)]
    if role == "worker":
        args += ["--", *description.command]
    return args


def role_env(description: Description, role: str, scheduler_addr: str) -> dict[str, str]:
    """The ``DMLC_*`` topology and the job's settings for one role (the worker id is added by each target)."""
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": scheduler_addr,
        "DMLC_PS_ROOT_PORT": str(description.port),
        "DMLC_NUM_WORKER": str(description.workers.count),
        "DMLC_NUM_SERVER": str(description.servers.count),
        "ENGINE": description.engine,
        "BYTEPS_SCHEDULER": description.schedule,
        "PYTHONUNBUFFERED": "1",
    }
    if role == "worker":
        env["BYTEPS_CPU_ONLY"] = "0" if description.workers.gpus else "1"
    env.update(description.env)
    return env


def _part(description: Description, role: str):
    return {"scheduler": description.scheduler, "server": description.servers, "worker": description.workers}[role]


# ------------------------------------------------------------------------------------- compose
def _file_safe(address: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", address)


def render_compose(description: Description) -> dict[str, dict]:
    """``{file name: compose document}``: one file per host address, its roles as services."""
    require_hosts(description, "--target compose")
    by_host: dict[str, dict] = {}
    for role, index, address in description.placements():
        name = host_name(role, index)
        env = role_env(description, role, description.scheduler_host)
        env["DMLC_NODE_HOST"] = address
        if role == "worker":
            env["DMLC_WORKER_ID"] = str(index)
        args = _args(description, role, ["--server-id", str(index)] if role == "server" else None)
        service = {
            "image": description.image,
            "network_mode": "host",   # the host's own address and ports: the image runs as on bare metal
            "init": True,              # forwards signals to the launcher and reaps what it leaves
            "shm_size": SHM_SIZE.replace("Gi", "gb"),
            "restart": "no",
            "entrypoint": _launcher(description),
            "environment": env,
        }
        if args:
            service["command"] = args
        if description.volumes:
            service["volumes"] = [f"{v.host}:{v.path}" + (":ro" if v.read_only else "") for v in description.volumes]
        part = _part(description, role)
        if role == "worker" and part.gpus:
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": part.gpus, "capabilities": ["gpu"]}]}}}
        by_host.setdefault(address, {"services": {}})["services"][name] = service
    return {f"compose-{_file_safe(address)}.yml": doc for address, doc in by_host.items()}


# ------------------------------------------------------------------------------------- kubernetes
def _labels(description: Description, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": description.name, ROLE_LABEL: role}


def _resources(description: Description, role: str) -> dict:
    part = _part(description, role)
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if part.cpu:
        requests["cpu"] = part.cpu
    if part.memory:
        requests["memory"] = limits["memory"] = part.memory
    if role == "worker" and part.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(part.gpus)  # extended resources: equal
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": value} for key, value in env.items()]


def _pod_spec(description: Description, role: str, env: list[dict], args: list[str], *,
              restart: str, shm: str = "shm") -> dict:
    container = {
        "name": role,
        "image": description.image,
        "imagePullPolicy": "IfNotPresent",
        "command": _launcher(description),
        "args": args,
        "env": env,
    }
    if role == "scheduler":
        container["ports"] = [{"name": "ps", "containerPort": description.port},
                              {"name": "control", "containerPort": description.control_port}]
    resources = _resources(description, role)
    if resources:
        container["resources"] = resources
    mounts, volumes = [], []
    for i, volume in enumerate(description.volumes):
        mounts.append({"name": f"data-{i}", "mountPath": volume.path, "readOnly": volume.read_only})
        volumes.append({"name": f"data-{i}", "hostPath": {"path": volume.host, "type": "Directory"}})
    mounts.append({"name": shm, "mountPath": "/dev/shm"})
    volumes.append({"name": shm, "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}})
    if mounts:
        container["volumeMounts"] = mounts
    spec = {"restartPolicy": restart, "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return spec


def _template(description: Description, role: str, spec: dict) -> dict:
    return {"metadata": {"labels": _labels(description, role)}, "spec": spec}


def render_k8s(description: Description) -> list[dict]:
    """The Kubernetes objects of the job, in the order ``kubectl apply`` should create them."""
    d = description
    scheduler_name = d.object_name("scheduler")
    server_name = d.object_name("server")
    worker_name = d.object_name("worker")
    objects: list[dict] = []
    objects.append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": scheduler_name, "labels": _labels(d, "scheduler")},
        "spec": {"selector": _labels(d, "scheduler"),
                 "ports": [{"name": "ps", "port": d.port, "targetPort": d.port},
                           {"name": "control", "port": d.control_port, "targetPort": d.control_port}]},
    })
    objects.append({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": scheduler_name, "labels": _labels(d, "scheduler")},
        "spec": {"replicas": 1, "selector": {"matchLabels": _labels(d, "scheduler")},
                 "template": _template(d, "scheduler", _pod_spec(
                     d, "scheduler", _env_list(role_env(d, "scheduler", scheduler_name)),
                     _args(d, "scheduler"), restart="Always"))},
    })
    objects.append({  # headless: gives the StatefulSet's pods their stable names
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": server_name, "labels": _labels(d, "server")},
        "spec": {"clusterIP": "None", "selector": _labels(d, "server")},
    })
    objects.append({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": server_name, "labels": _labels(d, "server")},
        "spec": {"serviceName": server_name, "replicas": d.servers.count, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": _labels(d, "server")},
                 "template": _template(d, "server", _pod_spec(
                     d, "server", _env_list(role_env(d, "server", scheduler_name)),
                     _args(d, "server"), restart="Always"))},
    })
    worker_env = _env_list(role_env(d, "worker", scheduler_name))
    worker_env.append({"name": "DMLC_WORKER_ID", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}})
    objects.append({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": worker_name, "labels": _labels(d, "worker")},
        "spec": {"completionMode": "Indexed", "completions": d.workers.count, "parallelism": d.workers.count,
                 "backoffLimit": 0,  # a failed worker fails the job: BytePS cannot take a worker back
                 "template": _template(d, "worker", _pod_spec(d, "worker", worker_env, _args(d, "worker"),
                                                              restart="Never"))},
    })
    return objects


# ------------------------------------------------------------------------------------- pods
def render_pods(description: Description) -> list[dict]:
    """One Pod per host: ``<name>-scheduler``, ``<name>-server-<i>``, ``<name>-worker-<i>``."""
    d = description
    scheduler_name = d.object_name("scheduler")
    pods = []
    for role, index, _address in d.placements():
        name = scheduler_name if role == "scheduler" else d.object_name(role, index)
        env = role_env(d, role, scheduler_name)
        if role == "worker":
            env["DMLC_WORKER_ID"] = str(index)
        args = _args(d, role, ["--server-id", str(index)] if role == "server" else None)
        labels = _labels(d, role)
        # podman plays an emptyDir as a named volume, shared by every pod that names it: one per pod
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                     "spec": _pod_spec(d, role, _env_list(env), args, restart="Never", shm=f"{name}-shm")})
    return pods


# ------------------------------------------------------------------------------------- files
def _dump(documents: list[dict], header: str) -> str:
    body = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, width=120)
    return header + body


def render(description: Description, target: str, out_dir: str | Path) -> list[tuple[Path, str]]:
    """Write the target's files into ``out_dir``; returns (path, what to do with it) for each."""
    if target not in TARGETS:
        raise ConfigError(f"--target {target!r} is not a target; valid: {', '.join(TARGETS)}")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out_dir}: cannot create it ({err.strerror or err})") from None
    origin = f"# Rendered by `byteps-prophet deploy render --target {target}` from {description.source}.\n"
    written: list[tuple[Path, str]] = []
    if target == "compose":
        files = render_compose(description)
        hosts = {f"compose-{_file_safe(a)}.yml": a for _r, _i, a in description.placements()}
        for name, doc in files.items():
            address = hosts[name]
            path = out / name
            note = f"on {address}: docker-compose -f {name} up   ({', '.join(doc['services'])})"
            path.write_text(_dump([doc], origin + f"# Host {address}; run there: docker-compose -f {name} up\n"))
            written.append((path, note))
    elif target == "k8s":
        path = out / "kubernetes.yaml"
        path.write_text(_dump(render_k8s(description), origin + "# kubectl apply -f kubernetes.yaml; the job is "
                                                                "done when the Job completes (docs/DEPLOY.md).\n"))
        written.append((path, f"kubectl apply -f {path.name}   (then kubectl wait --for=condition=complete "
                              f"job/{description.object_name('worker')})"))
    else:
        path = out / "pods.yaml"
        path.write_text(_dump(render_pods(description), origin + "# podman kube play --network NET pods.yaml "
                                                                 "(a network with DNS: pods find the scheduler "
                                                                 "by its pod name).\n"))
        written.append((path, f"podman network create bpp; podman kube play --network bpp {path.name}"))
    return written


# ------------------------------------------------------------------------------------- validation
def validate_documents(documents: list[dict], source: str, version: str | None = None) -> list[str]:
    """Check Kubernetes objects against the API's schema, offline (kubernetes-validate, strict: unknown
    fields are errors). Returns one line per invalid object; raises ConfigError when the package is
    missing or the version is unknown."""
    try:
        from kubernetes_validate import utils as kubernetes_validate
    except ImportError:
        raise ConfigError("deploy validate needs the kubernetes-validate package (pip install "
                          "kubernetes-validate; it is in requirements.txt)") from None
    version = version or kubernetes_validate.latest_version()
    if version not in kubernetes_validate.all_versions():
        raise ConfigError(f"--kubernetes-version {version!r} is not known to kubernetes-validate; valid: "
                          f"{', '.join(kubernetes_validate.all_versions())}")
    problems = []
    for number, doc in enumerate(documents):
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            problems.append(f"{source}: document {number + 1} is not a Kubernetes object (no kind/apiVersion)")
            continue
        what = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.absolute_path) or "(top)"
            problems.append(f"{source}: {what}: {path}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{source}: {what}: {err.message}")
    return problems


def validate_file(path: str | Path, version: str | None = None) -> tuple[int, list[str]]:
    """(number of objects, problems) for a YAML file of Kubernetes objects."""
    try:
        documents = [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc is not None]
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML") from None
    return len(documents), validate_documents(documents, str(path), version)
