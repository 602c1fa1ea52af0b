"""The systemd unit that runs ``slurmbox spot-watch`` on each spot node
(site-configs/systemd/slurmbox-spot-watch@.service): systemd accepts it, and the
command it starts, with each provider as the instance, polls that provider's metadata
format and exits 0 when no notice is posted.
"""

import configparser
import os
import shlex
import shutil
import subprocess

import pytest

from test_migrate_spot import FakeMetadata

UNIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "site-configs", "systemd",
                    "slurmbox-spot-watch@.service")


def exec_start(provider):
    """The unit's ExecStart command line (list) for instance ``provider`` (%i expanded)."""
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(UNIT)
    return shlex.split(unit["Service"]["ExecStart"].replace("%i", provider))


def test_the_unit_names_the_installed_command_and_restarts_after_an_evacuation():
    command = exec_start("aws")
    assert command[:4] == ["/opt/slurmbox/venv/bin/slurmbox", "spot-watch", "--provider", "aws"]
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(UNIT)
    assert unit["Service"]["Restart"] == "always" and int(unit["Service"]["RestartSec"]) > 0
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(not shutil.which("systemd-analyze") or not os.access(exec_start("aws")[0], os.X_OK),
                    reason="needs systemd-analyze and slurmbox installed under /opt/slurmbox (scripts/install.sh)")
def test_systemd_accepts_each_instance(tmp_path):
    shutil.copy(UNIT, tmp_path)
    for provider in ("aws", "gcp", "azure"):
        instance = tmp_path / ("slurmbox-spot-watch@%s.service" % provider)
        instance.symlink_to(tmp_path / os.path.basename(UNIT))
        result = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not os.access(exec_start("aws")[0], os.X_OK),
                    reason="slurmbox is not installed under /opt/slurmbox (scripts/install.sh)")
@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_the_started_command_polls_its_provider_and_exits_0_without_a_notice(provider):
    fake = FakeMetadata(provider)
    try:
        command = exec_start(provider) + ["--metadata-url", fake.url, "--once", "--node", "n1"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        fake.close()
    assert result.returncode == 0, result.stderr
    assert [r for r in fake.requests if r[0] == "GET"], "the metadata service was never asked"
