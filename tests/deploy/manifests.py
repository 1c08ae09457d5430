"""Reading deploy/'s images and manifests as the tests need them: the Dockerfile through Docker's
own parser, the Kubernetes objects as YAML, and what a daemon they configure would run with."""

from __future__ import annotations

import dockerfile
import yaml

from service.settings import Settings
from tests.deploy import commands
from tests.support.daemon import ROOT

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
KUBERNETES = ROOT / "deploy" / "kubernetes"


def stages() -> dict[str, list[dockerfile.Command]]:
    """Instructions by stage name ("" for the global ARGs before the first FROM)."""
    out: dict[str, list[dockerfile.Command]] = {"": []}
    name = ""
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            name = command.value[-1]
            out[name] = []
        out[name].append(command)
    return out


def image(target: str) -> dict[str, list]:
    """The configuration a target inherits: its own stage's instructions over its parents'."""
    all_stages = stages()
    chain, name = [], target
    while name and name in all_stages:
        chain.insert(0, all_stages[name])
        name = all_stages[name][0].value[0]
    config: dict[str, list] = {"ENV": {}, "EXPOSE": set(), "VOLUME": set()}
    for commands_ in chain:
        for c in commands_:
            if c.cmd == "ENV":
                config["ENV"].update(zip(c.value[::2], c.value[1::2]))
            elif c.cmd in ("EXPOSE", "VOLUME"):
                config[c.cmd].update(c.value)
            elif c.cmd in ("USER", "ENTRYPOINT", "CMD", "HEALTHCHECK"):
                assert c.json or c.cmd == "USER", f"{c.original}: use the JSON (exec) form"
                config[c.cmd] = list(c.value)
    return config


def manifests() -> dict[str, list[dict]]:
    return {path.name: list(yaml.safe_load_all(path.read_text()))
            for path in sorted(KUBERNETES.glob("*.yaml")) if path.name != "kustomization.yaml"}


def objects(kind: str) -> list[dict]:
    return [doc for docs in manifests().values() for doc in docs if doc["kind"] == kind]


def daemonsets() -> dict[str, dict]:
    return {ds["metadata"]["labels"]["hetserve.io/accelerator"]: ds
            for ds in objects("DaemonSet")}


def container_environment(ds: dict) -> dict[str, str]:
    """What the daemon container sees: the image's ENV, then envFrom, then env."""
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    target = container["image"].rpartition("-")[2]
    environ = dict(image(target)["ENV"])
    (config_map,) = objects("ConfigMap")
    for source in container["envFrom"]:
        assert source["configMapRef"]["name"] == config_map["metadata"]["name"]
        environ.update(config_map["data"])
    environ.update({e["name"]: e["value"] for e in container.get("env", [])})
    return environ


def daemon_settings(ds: dict) -> Settings:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    argv = image(container["image"].rpartition("-")[2])["ENTRYPOINT"] + container["args"]
    return commands.settings(argv, container_environment(ds))
