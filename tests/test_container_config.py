"""Container options in pyproject.toml: accepted as users write them, refused naming the key."""

from __future__ import annotations

import pytest

from spotchaos.config.container import ContainerSpec, Mount
from spotchaos.config.jobs import JobSpec, job_from_mapping
from spotchaos.errors import ConfigError

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)

SOURCE = "pyproject.toml"


def job(**table) -> JobSpec:
    return job_from_mapping("train", {"command": ["python", "train.py"], **table}, SOURCE)


def test_full_container_table_is_read():
    spec = job(
        image="team/train:1.4",
        container={
            "entrypoint": "/entry.sh",
            "mounts": ["/data:/data:ro", "/scratch:/scratch"],
            "user": "1000:1000",
            "cpus": 2.5,
            "memory": "16g",
            "shm_size": "2g",
            "working_dir": "/app",
            "gpus": "all",
            "network": "none",
            "env": {"HF_TOKEN": "hf_secret_value"},
        },
    ).container
    assert spec.image == "team/train:1.4" and spec.entrypoint == ("/entry.sh",)
    assert spec.mounts == (Mount("/data", "/data", True), Mount("/scratch", "/scratch", False))
    assert (spec.cpus, spec.memory, spec.shm_size, spec.gpus, spec.network) == (2.5, "16g", "2g", "all", "none")


def test_in_a_container_python_is_the_images_and_secrets_of_container_env_are_known():
    boxed = job(image="team/train:1.4", container={"env": {"HF_TOKEN": "hf_secret_value"}})
    assert boxed.argv(resume=False) == ["python", "train.py"]  # not the host's interpreter
    assert job().argv(resume=False)[0] != "python"  # on the host: the interpreter running pytest
    assert boxed.secrets() == ["hf_secret_value"]
    assert boxed.describe()["container"]["env"] == ["HF_TOKEN"]  # names only
    assert boxed.key() != job().key()  # another image may hold another torch: its own reference


def test_image_option_keeps_the_jobs_own_container_options():
    boxed = job(image="a:1", container={"shm_size": "1g"}).in_image("b:2")
    assert boxed.container.image == "b:2" and boxed.container.shm_size == "1g"
    assert job().in_image("b:2").container == ContainerSpec(image="b:2", where=boxed.container.where)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"container": {"shm_size": "1g"}}, r"\[tool.spotchaos.jobs.train\].container: needs an image"),
        ({"image": ""}, r"\[tool.spotchaos.jobs.train\].image: must be a non-empty image name"),
        ({"image": "a", "container": {"network": "bridge"}}, r"container.network: must be one of host, none"),
        ({"image": "a", "container": {"mounts": ["data:/data"]}}, r"container.mounts: 'data:/data' is not HOST_PATH"),
        ({"image": "a", "container": {"mounts": ["/d:/d:rx"]}}, r"container.mounts: '/d:/d:rx'"),
        ({"image": "a", "container": {"gpus": 0}}, r"container.gpus: must be a positive count or 'all'"),
        ({"image": "a", "container": {"gpus": "some"}}, r"container.gpus"),
        ({"image": "a", "container": {"cpus": -1}}, r"container.cpus: must be a number of CPUs"),
        ({"image": "a", "container": {"memory": "lots"}}, r"container.memory: must be a size"),
        ({"image": "a", "container": {"shm": "1g"}}, r"container.shm: unknown key \(known: .*shm_size"),
        ({"image": "a", "container": {"entrypoint": 3}}, r"container.entrypoint: must be a string or a list"),
        ({"image": "a", "container": "big"}, r"container: must be a table"),
    ],
)
def test_bad_container_options_name_the_key(table, message):
    with pytest.raises(ConfigError, match=message) as raised:
        job(**table)
    assert SOURCE in str(raised.value)
