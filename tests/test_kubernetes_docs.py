"""docs/kubernetes.md: every YAML block is a valid manifest, every ddpdoctor command in it parses with
the real CLI (test_ci_docs.parse_only: typer's own parser, so an unknown option or a bad value fails),
and the manifests give the containers what the doc says they need."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from test_ci_docs import BAD_PARAMETER, USAGE_ERROR, parse_only

DOC = Path(__file__).resolve().parent.parent / "docs" / "kubernetes.md"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.M | re.S)


def manifests(text: str) -> list[dict[str, Any]]:
    docs = [d for block in YAML_BLOCK.findall(text) for d in yaml.safe_load_all(block) if d is not None]
    for d in docs:
        assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and d["metadata"]["name"], d
    return docs


def pod_specs(manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod specs of a Pod, a Job/DaemonSet (spec.template) or a PyTorchJob (one per replica type)."""
    spec = manifest["spec"]
    if manifest["kind"] == "Pod":
        yield spec
    elif manifest["kind"] == "PyTorchJob":
        for replica in spec["pytorchReplicaSpecs"].values():
            yield replica["template"]["spec"]
    else:
        yield spec["template"]["spec"]


def ddpdoctor_argvs(container: dict[str, Any]) -> list[list[str]]:
    """argv after `ddpdoctor` of each ddpdoctor command a container runs: its command (+ args), or the
    command lines of a `sh -c` script."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:1] == ["ddpdoctor"]:
        return [argv[1:]]
    if argv[:2] in (["/bin/sh", "-c"], ["sh", "-c"]):
        out = []
        for part in re.split(r";|&&|\|\|", " ".join(argv[2:])):
            words = shlex.split(part)
            if "ddpdoctor" in words:
                out.append(words[words.index("ddpdoctor") + 1 :])
        return out
    return []


def caps(container: dict[str, Any]) -> set[str]:
    return set(container.get("securityContext", {}).get("capabilities", {}).get("add", []))


def mounts_dshm(spec: dict[str, Any], container: dict[str, Any]) -> bool:
    memory = {v["name"] for v in spec.get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"}
    return any(
        m["mountPath"] == "/dev/shm" and m["name"] in memory for m in container.get("volumeMounts", [])
    )


MANIFESTS = manifests(DOC.read_text())
COMMANDS = [
    argv
    for m in MANIFESTS
    for spec in pod_specs(m)
    for c in [*spec.get("initContainers", []), *spec["containers"]]
    for argv in ddpdoctor_argvs(c)
]


def test_the_doc_has_a_pod_a_job_and_a_pytorchjob():
    kinds = {m["kind"] for m in MANIFESTS}
    assert {"Pod", "Job", "PyTorchJob"} <= kinds


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_ddpdoctor_command_in_a_manifest_parses(argv):
    parse_only(argv)


def test_inline_commands_parse():
    inline = re.findall(r"`(?:kubectl exec \S+ -c \S+ -- )?ddpdoctor ([a-z][^`]*)`", DOC.read_text())
    blocks = re.findall(r"-- ddpdoctor ([a-z][^`\n]*)$", DOC.read_text(), re.M)
    for cmd in [*inline, *blocks]:
        parse_only(shlex.split(cmd))
    assert any(c.startswith("hang") for c in blocks)


def test_training_pods_are_preflighted_with_what_they_need():
    pods = [(m, s) for m in MANIFESTS if m["kind"] != "DaemonSet" for s in pod_specs(m)]
    assert len(pods) >= 4  # Pod, Job, PyTorchJob Master and Worker
    for manifest, spec in pods:
        where = f"{manifest['kind']} {manifest['metadata']['name']}"
        (init,) = [c for c in spec["initContainers"] if ddpdoctor_argvs(c)]
        (argv,) = ddpdoctor_argvs(init)
        assert argv[0] == "check" and "--strict" in argv, where
        train = spec["containers"][0]
        # The check sees the node as the training container does.
        assert init["image"] == train["image"], where
        assert init["resources"] == train["resources"], where
        assert "IPC_LOCK" in caps(init) and "IPC_LOCK" in caps(train), where
        assert "SYS_PTRACE" in caps(train), where  # for `kubectl exec ... ddpdoctor hang`
        assert mounts_dshm(spec, init) and mounts_dshm(spec, train), where


def test_a_wrong_option_in_a_manifest_fails():
    broken = DOC.read_text().replace('"--strict"', '"--strikt"', 1)
    (argv,) = [
        a for m in manifests(broken) for s in pod_specs(m) for c in s.get("initContainers", [])
        for a in ddpdoctor_argvs(c) if "--strikt" in a
    ]  # fmt: skip
    with pytest.raises(USAGE_ERROR):
        parse_only(argv)
    # In the Job's init container (the Pod's names an --expect file absent here, which parse_only excuses).
    job = '["ddpdoctor", "check", "--strict", "--timeout", "30"]'
    assert job in DOC.read_text()
    bad_value = DOC.read_text().replace(job, job.replace('"30"', '"soon"'), 1)
    (argv,) = [
        a for m in manifests(bad_value) for s in pod_specs(m) for c in s.get("initContainers", [])
        for a in ddpdoctor_argvs(c) if "soon" in a
    ]  # fmt: skip
    with pytest.raises(BAD_PARAMETER):
        parse_only(argv)
