"""The KubeRay deployment (deploy/kuberay, docs/ray.md): its manifests parse, its pods hold what Hermes writes, and
the spec it runs loads, in a mock of the head pod's layout (the volumes under a temporary folder, HOME /home/ray).

No cluster: what Kubernetes would refuse or Hermes would fail on at its first run, found without one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.experiment import load_spec
from hermes.experiment.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kuberay"
MANIFEST = DEPLOY / "raycluster.yaml"
SPEC = DEPLOY / "experiment.yaml"
DOCS = ROOT / "docs" / "ray.md"
RAY_UID = 1000  # the user rayproject/ray images run as


def documents() -> list[dict[str, Any]]:
    found = [doc for path in sorted(DEPLOY.glob("*.yaml")) if path != SPEC
             for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert found and all("kind" in doc and "apiVersion" in doc for doc in found)
    return found


def pod_specs() -> dict[str, dict[str, Any]]:
    """The head's and each worker group's pod spec, by group."""
    cluster = next(doc for doc in documents() if doc["kind"] == "RayCluster")["spec"]
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    pods |= {group["groupName"]: group["template"]["spec"] for group in cluster["workerGroupSpecs"]}
    return pods


def in_layout(root: Path, text: str) -> str:
    """The spec's absolute paths moved under ``root``, where the mock pod's volumes lie."""
    return text.replace("/var/lib/hermes", f"{root}/var/lib/hermes").replace("/mnt/hermes", f"{root}/mnt/hermes")


@pytest.fixture
def head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The head pod's folders under ``tmp_path``: the specs' folder with a training module, the volumes, the home."""
    for folder in ("mnt/hermes/specs", "mnt/hermes/checkpoints", "var/lib/hermes", "home/ray"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "mnt/hermes/specs/train.py").write_text("def train(config):\n    pass\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "ray"))
    return tmp_path


def test_every_manifest_parses_and_every_claim_and_volume_it_names_is_there() -> None:
    claims = {doc["metadata"]["name"] for doc in documents() if doc["kind"] == "PersistentVolumeClaim"}
    for group, pod in pod_specs().items():
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for volume in volumes.values():
            assert "emptyDir" in volume or volume["persistentVolumeClaim"]["claimName"] in claims, (group, volume)
        for container in pod["containers"]:
            assert {mount["name"] for mount in container["volumeMounts"]} <= set(volumes), group


def test_the_documented_spec_loads_on_the_head_and_every_pod_can_write_where_it_points(head: Path) -> None:
    spec_file = head / "mnt/hermes/specs/experiment.yaml"
    spec_file.write_text(in_layout(head, SPEC.read_text()))
    spec = load_spec(spec_file)
    assert spec.storage_dir == head / "var/lib/hermes/runs"
    assert spec.checkpoint_uri == f"file://{head}/mnt/hermes/checkpoints/{spec.name}"
    # Without allow_outside, load_spec refuses it: that line is needed, not decoration.
    data = yaml.safe_load(spec_file.read_text())
    del data["storage"]["allow_outside"]
    spec_file.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="storage.allow_outside: true"):
        load_spec(spec_file)

    stored = yaml.safe_load(SPEC.read_text())
    needed = [stored["storage"]["dir"], stored["storage"]["uri"].removeprefix("file://"), "/mnt/hermes/specs"]
    for group, pod in pod_specs().items():
        # Agents write <storage.dir>/<name>/nodes/<node>/ on every node; the trials' code and checkpoints are shared.
        assert pod["securityContext"]["fsGroup"] == RAY_UID, group
        for container in pod["containers"]:
            mounted = [mount["mountPath"] for mount in container["volumeMounts"]]
            for path in needed:
                assert any(Path(path).is_relative_to(place) for place in mounted), (group, path, mounted)


def test_the_docs_spec_lines_load_in_the_same_layout(head: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    on_kubernetes = [block for block in blocks if "/var/lib/hermes" in block]
    assert on_kubernetes
    for lines in on_kubernetes:  # the docs' lines in place of the example's
        data = yaml.safe_load(in_layout(head, SPEC.read_text())) | yaml.safe_load(in_layout(head, lines))
        spec_file = head / "mnt/hermes/specs/experiment.yaml"
        spec_file.write_text(yaml.safe_dump(data))
        assert load_spec(spec_file).storage_dir == head / "var/lib/hermes/runs"


def test_the_head_serves_hermes_and_its_image_has_the_extras_for_it() -> None:
    head = pod_specs()["head"]["containers"][0]
    assert {"containerPort": 8600, "name": "hermes"} in head["ports"]  # KubeRay's head Service carries it
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = re.findall(r'pip install [^"]*"(?:hermes-hpo|/opt/hermes)\[([^\]]+)\]"', MANIFEST.read_text())
    assert installed and all({"ray", "server"} <= set(names.split(",")) <= set(extras) for names in installed)
