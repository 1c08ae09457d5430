"""The Kubernetes manifests: valid against the API's schemas (shipped with kubernetes-validate,
offline), consistent with each other and with the daemon's real CLI and settings; the plaintext
health port answers the way kubelet's gRPC probes ask; the spark-submit example parses."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
from pathlib import Path

import grpc
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.local_daemon import free_port
from spark_jobs import score
from spark_jobs.daemon import ADDRESS_CONF, ADDRESS_ENV
from tests.deploy import commands
from tests.deploy.manifests import KUBERNETES as FOLDER
from tests.deploy.manifests import (
    container_environment,
    daemon_settings,
    daemonsets,
    image,
    manifests,
    objects,
)
from tests.support.daemon import MODELS, ROOT

# The oldest Kubernetes the manifests support (gRPC probes are GA since 1.27) and the newest
# whose schemas kubernetes-validate ships.
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
ACCELERATOR_RESOURCES = {"gpu": "nvidia.com/gpu", "fpga-xilinx": "amd.com/xilinx_",
                         "fpga-intel": "fpga.intel.com/region-"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str) -> None:
    found = manifests()
    assert {"DaemonSet", "ConfigMap", "Namespace", "ServiceAccount", "Pod", "Role",
            "RoleBinding"} <= {
        doc["kind"] for docs in found.values() for doc in docs}
    for name, docs in found.items():
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name}: {doc['kind']}: {e}")


def test_the_validation_is_strict() -> None:
    ds = copy.deepcopy(daemonsets()["gpu"])
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["grcp"] = container["readinessProbe"].pop("grpc")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_kustomize_applies_every_manifest_but_the_spark_ones() -> None:
    kustomization = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == set(manifests()) - {
        "spark-executor-template.yaml", "spark-jobs.yaml"}


def test_one_daemonset_per_kind_of_node_with_its_devices() -> None:
    sets = daemonsets()
    assert set(sets) == {"cpu", "gpu", "fpga-xilinx", "fpga-intel"}
    selectors = set()
    for kind, ds in sets.items():
        pod = ds["spec"]["template"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        selectors.add(json.dumps(ds["spec"]["selector"]["matchLabels"], sort_keys=True))
        (container,) = pod["spec"]["containers"]
        limits = container["resources"]["limits"]
        devices = [r for r in limits if r not in ("cpu", "memory")]
        if kind == "cpu":
            assert devices == [] and container["image"].endswith("-cpu")
        else:
            (device,) = devices
            assert device.startswith(ACCELERATOR_RESOURCES[kind]), (kind, device)
            assert container["image"].endswith("-gpu" if kind == "gpu" else "-cpu")
            assert pod["spec"]["tolerations"]
        assert pod["spec"]["nodeSelector"]
    assert len(selectors) == len(sets)  # no two DaemonSets claim each other's pods


@pytest.mark.parametrize("kind", ["cpu", "gpu", "fpga-xilinx", "fpga-intel"])
def test_each_daemonset_serves_the_socket_probes_and_metrics_its_settings_say(kind: str) -> None:
    ds = daemonsets()[kind]
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    settings = daemon_settings(ds)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    # The socket folder and shared memory are host folders, the repository read-only.
    socket_volume = volumes[mounts[str(settings.unix_socket.parent)]]
    assert socket_volume["hostPath"]["path"] == "/run/hetserve"
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == "/dev/shm/hetserve"
    assert str(settings.model_repository) in mounts
    assert any(m["mountPath"] == str(settings.model_repository) and m["readOnly"]
               for m in container["volumeMounts"])
    # kubelet probes the plaintext health port, which binds where the metrics do: the pod IP.
    assert settings.health_port and settings.metrics_host == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == settings.health_port, probe
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": settings.metrics_port, "health": settings.health_port}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == settings.metrics_port
    # gRPC stays on loopback: no TLS or token needed, none exposed.
    assert settings.grpc_host == "127.0.0.1"
    assert spec["terminationGracePeriodSeconds"] > settings.shutdown_grace_s
    # The image's user, unprivileged; the writable places are volumes.
    assert spec["securityContext"]["runAsUser"] == int(image("cpu")["USER"][0].split(":")[0])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Caches and FPGA binaries are in volumes: the root file system is read-only.
    env = container_environment(ds)
    for variable in ("XDG_CACHE_HOME", "CUDA_CACHE_PATH", "HETSERVE_FPGA_BINARIES"):
        if variable in env:
            assert env[variable].startswith(tuple(mounts)), variable


def test_spark_executors_mount_the_daemons_socket_folder() -> None:
    (template,) = objects("Pod")
    (executor, *_) = template["spec"]["containers"]
    settings = daemon_settings(daemonsets()["cpu"])
    mounts = {m["mountPath"]: m["name"] for m in executor["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    daemon_volumes = {v["name"]: v for v in daemonsets()["cpu"]["spec"]["template"]["spec"]
                      ["volumes"]}
    for path, daemon_volume in ((settings.unix_socket.parent, "socket"), ("/dev/shm", "shm")):
        host = volumes[mounts[str(path)]]["hostPath"]
        assert host["path"] == daemon_volumes[daemon_volume]["hostPath"]["path"]
        assert host["type"] == "Directory"  # the daemon's pod makes it; executors wait for it
    env = {e["name"]: e["value"] for e in executor["env"]}
    assert env[ADDRESS_ENV] == f"unix:{settings.unix_socket}"
    # Same user as the daemon: the socket folder admits only it.
    assert template["spec"]["securityContext"]["runAsUser"] == \
        daemonsets()["cpu"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_the_spark_submit_example_targets_kubernetes_with_the_template(tmp_path: Path) -> None:
    # A stand-in spark-submit that records the command line the script builds.
    stub = tmp_path / "spark-submit"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}",
                        "ARGS_OUT": str(tmp_path / "args"),
                        "K8S_API": "https://api.example.com:6443"}
    subprocess.run([str(FOLDER / "spark-submit.sh"), "s3a://in/digits.parquet",
                    "s3a://out/scored.parquet"], env=env, check=True)
    args = (tmp_path / "args").read_text().splitlines()
    options, conf, rest = {}, {}, list(args)
    while rest[0].startswith("--"):
        key, value = rest.pop(0), rest.pop(0)
        if key == "--conf":
            name, _, setting = value.partition("=")
            conf[name] = setting
        else:
            options[key] = value
    assert options["--master"] == "k8s://https://api.example.com:6443"
    assert options["--deploy-mode"] == "cluster"
    # Its namespace and service account exist in spark-jobs.yaml, bound to a role that may
    # create the executors' pods.
    namespace = conf["spark.kubernetes.namespace"]
    account = conf["spark.kubernetes.authenticate.driver.serviceAccountName"]
    spark_jobs = manifests()["spark-jobs.yaml"]
    assert {(d["kind"], d["metadata"]["name"]) for d in spark_jobs} >= {
        ("Namespace", namespace), ("ServiceAccount", account)}
    (binding,) = [d for d in spark_jobs if d["kind"] == "RoleBinding"]
    (role,) = [d for d in spark_jobs if d["kind"] == "Role"
               and d["metadata"]["name"] == binding["roleRef"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": namespace}]
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in role["rules"])
    assert Path(conf["spark.kubernetes.executor.podTemplateFile"]) == \
        FOLDER / "spark-executor-template.yaml"
    assert conf[ADDRESS_CONF] == f"unix:{daemon_settings(daemonsets()['cpu']).unix_socket}"
    application, *app_args = rest
    assert application == "local:///opt/hetserve/spark_jobs/score.py"
    assert (ROOT / "spark_jobs" / "score.py").is_file()
    parsed = score.parse_args(app_args)
    assert (parsed.input, parsed.output, parsed.no_start_daemon) == (
        "s3a://in/digits.parquet", "s3a://out/scored.parquet", True)
    assert (MODELS / parsed.model).is_dir()
    # Without the API server's address it stops before calling spark-submit.
    env.pop("K8S_API")
    failed = subprocess.run([str(FOLDER / "spark-submit.sh"), "a", "b"], env=env,
                            capture_output=True, text=True)
    assert failed.returncode != 0 and "K8S_API" in failed.stderr


def test_the_health_port_answers_kubelets_probe_and_nothing_else(tmp_path: Path) -> None:
    """The daemon as the DaemonSet configures it (paths and ports mapped to this machine)."""
    environ = {k: v for k, v in container_environment(daemonsets()["cpu"]).items()
               if k.startswith("HETSERVE_")} | {
        "HETSERVE_MODEL_REPOSITORY": str(MODELS),
        "HETSERVE_UNIX_SOCKET": str(tmp_path / "grpc.sock"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HETSERVE_GRPC_PORT": str(free_port()), "HETSERVE_METRICS_PORT": str(free_port()),
        "HETSERVE_HEALTH_PORT": str(free_port()), "HETSERVE_METRICS_HOST": "127.0.0.1"}
    log = tmp_path / "daemon.log"
    daemon = commands.start(["hetserve", "serve"], environ, log)
    try:
        commands.wait_ready(f"unix:{tmp_path / 'grpc.sock'}", daemon, log)
        with grpc.insecure_channel(f"127.0.0.1:{environ['HETSERVE_HEALTH_PORT']}") as channel:
            # kubelet asks with an empty service name, in plaintext, without credentials.
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as refused:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(
                    service_pb2.ServerMetadataRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        assert commands.stop(daemon) == 0
