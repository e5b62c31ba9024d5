"""One cluster description rendered as per-host compose files, Kubernetes manifests and Pods; every
Kubernetes object checked against the API's schema offline (kubernetes-validate, strict)."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys

import pytest
import yaml

from byteps_prophet.deploy.description import load_description, parse_description
from byteps_prophet.deploy.render import render, render_compose, render_k8s, render_pods, validate_documents
from byteps_prophet.errors import ConfigError

CLI = [sys.executable, "-m", "byteps_prophet"]
DESCRIPTION = """
name: bpp
image: registry.example/byteps-prophet:cuda
schedule: prophet
command: python train.py --epochs 3
env: {TRAIN_MODEL: mlp, NCCL_DEBUG: WARN}
volumes: [{host: /data, path: /data, read_only: true}]
scheduler: {host: 10.0.0.1, cpu: 1, memory: 1Gi}
servers: {hosts: [10.0.0.1, 10.0.0.2], cpu: "2", memory: 4Gi}
workers: {hosts: [10.0.0.3, 10.0.0.4, 10.0.0.4], cpu: 500m, memory: 8Gi, gpus: 1}
"""


@pytest.fixture
def description(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(DESCRIPTION)
    return load_description(path)


def _env(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_k8s_objects_are_the_roles_with_the_worker_index_and_resources(description):
    objects = render_k8s(description)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Service", "bpp-scheduler"), ("Deployment", "bpp-scheduler"), ("Service", "bpp-server"),
        ("StatefulSet", "bpp-server"), ("Job", "bpp-worker")]
    service, deployment, headless, servers, job = objects
    assert [p["port"] for p in service["spec"]["ports"]] == [9000, 9001]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["clusterIP"] == "None" and servers["spec"]["serviceName"] == "bpp-server"
    assert servers["spec"]["replicas"] == 2 and deployment["spec"]["replicas"] == 1
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    worker = spec["template"]["spec"]["containers"][0]
    env = _env(worker)
    assert env["DMLC_WORKER_ID"] == {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert (env["DMLC_ROLE"], env["DMLC_PS_ROOT_URI"], env["DMLC_NUM_WORKER"], env["DMLC_NUM_SERVER"]) == \
        ("worker", "bpp-scheduler", "3", "2")
    assert env["BYTEPS_SCHEDULER"] == "prophet" and env["BYTEPS_CPU_ONLY"] == "0" and env["NCCL_DEBUG"] == "WARN"
    assert worker["command"] == ["python", "-m", "byteps_prophet", "launch"]
    assert worker["args"] == ["--", "python", "train.py", "--epochs", "3"]
    assert worker["resources"] == {"requests": {"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": "1"},
                                   "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}
    scheduler = deployment["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert _env(scheduler)["DMLC_ROLE"] == "scheduler" and "DMLC_WORKER_ID" not in _env(scheduler)
    assert {"name": "data-0", "mountPath": "/data", "readOnly": True} in worker["volumeMounts"]


def test_every_rendered_object_passes_the_kubernetes_schema(description):
    pytest.importorskip("kubernetes_validate")
    objects = render_k8s(description) + render_pods(description)
    assert validate_documents(objects, "rendered") == []
    import kubernetes_validate.utils as kv

    oldest = kv.all_versions()[0]
    assert validate_documents(objects, "rendered", oldest) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda o: o["spec"].__setitem__("completionMode", 7), "spec.completionMode"),
    (lambda o: o["spec"]["template"]["spec"]["containers"][0].__setitem__("gpus", 1), "containers.0"),
    (lambda o: o["spec"].__setitem__("parallelism", "two"), "spec.parallelism"),
])
def test_the_schema_check_catches_a_broken_object(description, mutate, expected):
    pytest.importorskip("kubernetes_validate")
    job = copy.deepcopy(render_k8s(description)[-1])
    mutate(job)
    problems = validate_documents([job], "broken.yaml")
    assert len(problems) == 1 and problems[0].startswith("broken.yaml: Job/bpp-worker: ")
    assert expected in problems[0], problems


def test_pods_are_one_per_host_with_explicit_indexes(description):
    pods = render_pods(description)
    assert [p["metadata"]["name"] for p in pods] == [
        "bpp-scheduler", "bpp-server-0", "bpp-server-1", "bpp-worker-0", "bpp-worker-1", "bpp-worker-2"]
    for pod in pods:
        assert pod["kind"] == "Pod" and pod["spec"]["restartPolicy"] == "Never"
        env = _env(pod["spec"]["containers"][0])
        assert env["DMLC_PS_ROOT_URI"] == "bpp-scheduler"
    assert [_env(p["spec"]["containers"][0])["DMLC_WORKER_ID"] for p in pods[3:]] == ["0", "1", "2"]
    assert pods[2]["spec"]["containers"][0]["args"] == ["--server-id", "1"]


def test_compose_files_are_per_host_on_the_host_network(description):
    files = render_compose(description)
    assert sorted(files) == ["compose-10.0.0.1.yml", "compose-10.0.0.2.yml", "compose-10.0.0.3.yml",
                             "compose-10.0.0.4.yml"]
    assert list(files["compose-10.0.0.1.yml"]["services"]) == ["scheduler", "server-0"]
    assert list(files["compose-10.0.0.4.yml"]["services"]) == ["worker-1", "worker-2"]
    for doc in files.values():
        for name, service in doc["services"].items():
            assert service["network_mode"] == "host" and service["image"] == "registry.example/byteps-prophet:cuda"
            env = service["environment"]
            assert env["DMLC_PS_ROOT_URI"] == "10.0.0.1" and env["DMLC_NUM_WORKER"] == "3"
    worker = files["compose-10.0.0.4.yml"]["services"]["worker-2"]
    assert worker["environment"]["DMLC_WORKER_ID"] == "2" and worker["environment"]["DMLC_NODE_HOST"] == "10.0.0.4"
    assert worker["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert worker["volumes"] == ["/data:/data:ro"]


def test_a_compose_service_is_what_launch_runs_on_that_host(description):
    """The environment a compose file gives a container, read by `launch` as a host would."""
    service = render_compose(description)["compose-10.0.0.4.yml"]["services"]["worker-2"]
    argv = service["entrypoint"][1:] + ["--dry-run"] + service["command"]
    argv[0:3] = CLI[1:] + ["launch"]  # the image's python: here this one
    proc = subprocess.run([sys.executable] + argv, env={"PATH": "/usr/bin:/bin", **service["environment"]},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "worker-2: python train.py --epochs 3"
    assert "    control: connects to 10.0.0.1:9001" in lines
    assert "    DMLC_NODE_HOST=10.0.0.4" in lines and "    DMLC_WORKER_ID=2" in lines


def test_compose_files_pass_docker_compose_config(description, tmp_path):
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    for path, _note in render(description, "compose", tmp_path / "out"):
        proc = subprocess.run([binary, "-f", str(path), "config", "-q"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


def test_render_cli_writes_the_files_and_validate_cli_checks_them(tmp_path):
    (tmp_path / "cluster.yaml").write_text(DESCRIPTION)
    for target in ("compose", "k8s", "pods"):
        proc = subprocess.run(CLI + ["deploy", "render", "--cluster", str(tmp_path / "cluster.yaml"), "--target",
                                     target, "--out", str(tmp_path / "out")], capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.startswith("wrote "), proc.stderr
    k8s = list(yaml.safe_load_all((tmp_path / "out" / "kubernetes.yaml").read_text()))
    assert [o["kind"] for o in k8s] == ["Service", "Deployment", "Service", "StatefulSet", "Job"]
    assert (tmp_path / "out" / "compose-10.0.0.3.yml").exists()
    pytest.importorskip("kubernetes_validate")
    proc = subprocess.run(CLI + ["deploy", "validate", str(tmp_path / "out" / "kubernetes.yaml"),
                                 str(tmp_path / "out" / "pods.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{tmp_path}/out/kubernetes.yaml: 5 of 5 objects valid",
                                        f"{tmp_path}/out/pods.yaml: 6 of 6 objects valid"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                      "spec": {"containers": [{"name": "x", "image": "x", "ports": "80"}]}}))
    proc = subprocess.run(CLI + ["deploy", "validate", str(broken)], capture_output=True, text=True)
    assert proc.returncode == 1 and "Pod/x: spec.containers.0.ports:" in proc.stderr


def test_counts_alone_render_for_kubernetes_but_not_for_compose(tmp_path):
    description = parse_description({"servers": {"count": 2}, "workers": {"count": 4}})
    assert render_k8s(description)[-1]["spec"]["completions"] == 4
    with pytest.raises(ConfigError, match="--target compose needs every host's address; missing: "
                                          "scheduler.host, servers.hosts, workers.hosts"):
        render(description, "compose", tmp_path)


@pytest.mark.parametrize("text, culprit", [
    ("nme: x", "unknown key 'nme'; valid: name, image"),
    ("name: Big_Name", "name: 'Big_Name' is invalid; valid: lowercase letters"),
    ("engine: tensorflow", "engine: 'tensorflow' is not an engine; valid: byteps, mxnet"),
    ("schedule: lifo", "schedule: 'lifo' is not a scheduler; valid: fifo, bytescheduler, prophet"),
    ("port: 99999", "port: 99999 is not a TCP port"),
    ("workers: {count: 0}", "workers.count: 0 is invalid; valid: an integer >= 1"),
    ("workers: {count: 3, hosts: [a, b]}", "workers: count 3 but 2 hosts"),
    ("workers: {gpus: 2}", "workers.gpus: 2 is invalid; valid: 0 (CPU-only) or 1"),
    ("servers: {memory: 4GB}", "servers.memory: '4GB' is not a quantity"),
    ("env: {DMLC_NUM_WORKER: 3}", "env.DMLC_NUM_WORKER: is set from the roles and hosts of the description"),
    ("env: {BYTEPS_SCHEDULER: fifo}", "env.BYTEPS_SCHEDULER: is set from schedule of the description"),
    ("volumes: [{host: data, path: /data}]", "volumes[0].host: 'data' is invalid; valid: an absolute path"),
    ("command: ''", "command: is empty"),
    ("scheduler: [a]", "scheduler: must be a mapping with keys host, cpu, memory"),
    ("workers: {hosts: [a, b c]}", "workers.hosts[1]: 'b c' is not a host address"),
    ("a: [", "not valid YAML at line"),
])
def test_a_bad_description_is_one_line_naming_the_key_exit_2(tmp_path, text, culprit):
    path = tmp_path / "cluster.yaml"
    path.write_text(text + "\n")
    proc = subprocess.run(CLI + ["deploy", "render", "--cluster", str(path), "--target", "k8s", "--out",
                                 str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and str(path) in lines[0], proc.stderr


def test_render_cli_bad_target_and_missing_file(tmp_path):
    (tmp_path / "c.yaml").write_text("name: x\n")
    proc = subprocess.run(CLI + ["deploy", "render", "--cluster", str(tmp_path / "c.yaml"), "--target", "swarm",
                                 "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--target 'swarm' is not a target; valid: compose, k8s, pods" in proc.stderr
    proc = subprocess.run(CLI + ["deploy", "render", "--cluster", str(tmp_path / "none.yaml"), "--target", "k8s",
                                 "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot read it" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_launch_from_the_description_takes_the_hosts_place(tmp_path):
    (tmp_path / "cluster.yaml").write_text(DESCRIPTION)
    proc = subprocess.run(CLI + ["launch", "--cluster", str(tmp_path / "cluster.yaml"), "--host", "worker-1",
                                 "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "worker-1: python train.py --epochs 3"
    for line in ("DMLC_WORKER_ID=1", "DMLC_NODE_HOST=10.0.0.4", "DMLC_PS_ROOT_URI=10.0.0.1", "DMLC_NUM_SERVER=2",
                 "BYTEPS_SCHEDULER=prophet", "BYTEPS_CPU_ONLY=0"):
        assert f"    {line}" in lines, proc.stdout
    proc = subprocess.run(CLI + ["launch", "--cluster", str(tmp_path / "cluster.yaml"), "--host", "worker-9"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--host 'worker-9' is not a host of" in proc.stderr
    assert "valid: scheduler, server-0, server-1, worker-0, worker-1, worker-2" in proc.stderr
    proc = subprocess.run(CLI + ["launch", "--cluster", str(tmp_path / "cluster.yaml"), "--host", "worker-1",
                                 "--workers", "3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--workers cannot be combined with --cluster" in proc.stderr
