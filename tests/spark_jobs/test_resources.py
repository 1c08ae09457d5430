"""Spark resource discovery on this host (PoCL: OpenCL, no FPGA, no NVIDIA driver) and the
stage-level ResourceProfile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelerators.devices import opencl_devices
from spark_jobs.resources import task_profile
from tests.support.daemon import ROOT


@pytest.mark.parametrize("kind", ["fpga", "gpu"])
def test_discovery_script_prints_sparks_resource_json(kind):
    result = subprocess.run([ROOT / "spark_jobs" / f"discover-{kind}.sh"], capture_output=True,
                            text=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                            timeout=60, check=True)
    found = json.loads(result.stdout)
    expected = [str(i) for i in range(sum(d.kind == kind for d in opencl_devices()))]
    assert found == {"name": kind, "addresses": expected}
    assert opencl_devices(), "PoCL should be found here: the OpenCL path was not exercised"


def test_task_profile_asks_executors_and_tasks_for_the_accelerator():
    profile = task_profile("fpga=0.5")
    assert profile.executorResources["fpga"].amount == 1
    assert profile.taskResources["fpga"].amount == 0.5
    assert not task_profile("gpu=1", new_executors=False).executorResources
    with pytest.raises(ValueError, match="expected fpga=AMOUNT or gpu=AMOUNT"):
        task_profile("tpu=1")


def test_addresses_from_the_environment_replace_the_probe():
    result = subprocess.run([ROOT / "spark_jobs" / "discover-fpga.sh"], capture_output=True,
                            text=True, timeout=60, check=True,
                            env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                                 "HETSERVE_FPGA_ADDRESSES": "card-a,card-b"})
    assert json.loads(result.stdout) == {"name": "fpga", "addresses": ["card-a", "card-b"]}
