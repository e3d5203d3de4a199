"""serving/docker-compose.yml's images are pinned to the TensorFlow version setup.py
requires: no `latest`, and the GPU image of the same version."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_every_serving_image_is_the_required_tensorflow_version():
    pin = re.search(r'"tensorflow>=(\d+\.\d+),<', (ROOT / "setup.py").read_text()).group(1)
    compose = yaml.safe_load((ROOT / "serving" / "docker-compose.yml").read_text())
    images = {name: service["image"] for name, service in compose["services"].items()}
    assert set(images) == {"tfserving", "tfserving-xla", "tfserving-gpu"}
    for name, image in images.items():
        repository, tag = image.split(":")
        assert repository == "tensorflow/serving"
        suffix = "-gpu" if name.endswith("gpu") else ""
        assert re.fullmatch(rf"{re.escape(pin)}\.\d+{suffix}", tag), (name, image)
