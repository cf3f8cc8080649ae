"""The one-node Slurm of the test session (tests/slurm/cluster.py): started once, always stopped after.

Missing Slurm is a failure, not a skip, where `make setup` could have installed it (apt-get and root, or
passwordless sudo); elsewhere the tests are skipped with a note saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.slurm.cluster import SlurmCluster, missing_binaries


def _setup_could_install() -> bool:
    if shutil.which("apt-get") is None:
        return False
    if os.geteuid() == 0:
        return True
    return shutil.which("sudo") is not None and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        msg = f"Slurm is not installed ({', '.join(missing)} missing): `make setup` installs Debian's slurm-wlm and munge"
        if _setup_could_install():
            pytest.fail(msg + " on this machine; run it")
        pytest.skip(msg + " where apt-get and root are available; install slurm-wlm and munge yourself")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm runs slurmd, which starts jobs, as root; run the Slurm tests as root")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
