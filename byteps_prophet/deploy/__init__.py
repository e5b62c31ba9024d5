"""Beyond one machine: one cluster description drives every way of running the job on real hosts.

* :mod:`.description`: the description (YAML, docs/DEPLOY.md): roles, addresses, image, resources;
* :mod:`.launch`: ``byteps-prophet launch``, run on each host with its role (the ``DMLC_*`` variables
  BytePS documents); the scheduler host supervises the job (:mod:`.coordinator`), the others follow
  it (:mod:`.follower`), each running its role's process (:mod:`.role`), so a failed or dead host ends it;
* :mod:`.render`: per-host compose files (``network_mode: host``), Kubernetes manifests and
  podman-playable Pods from the description (``byteps-prophet deploy render``);
* :mod:`.gpu`: the GPU check's build flags, argument checks and training (scripts/gpu_check.sh).

This room depends on ``byteps_prophet.cluster`` (role environment, serve command, the agent's wire
format) and names the job a description runs by default, the training entrypoint of
``byteps_prophet.ab.workloads``; nothing depends on it but the CLI.
"""
