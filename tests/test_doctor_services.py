"""slurmbox doctor's service and runtime checks: munge, slurmd and slurmctld
(real scontrol against a port nobody listens on, and recorded outputs of the
real tools for the answers that need running daemons), and runsc missing, its
release, and a trivial sandbox that does not start."""

import socket

import pytest

from slurmbox.doctor import node_checks, runtime_checks
from slurmbox.slurm_client import scontrol
from slurmbox.doctor.context import NodeContext
from slurmbox.doctor.report import FAIL, NOT_PRESENT, PASS, WARN

# Recorded on this machine (munge 0.5.15): a private munged, then with munged stopped.
UNMUNGE_SUCCESS = """STATUS:          Success (0)
ENCODE_HOST:     localhost (127.0.0.1)
ENCODE_TIME:     2026-11-30 03:45:07 +0000 (1796010307)
DECODE_TIME:     2026-11-30 03:45:07 +0000 (1796010307)
TTL:             300
CIPHER:          aes128 (4)
MAC:             sha256 (5)
ZIP:             none (0)
UID:             root (0)
GID:             root (0)
LENGTH:          0"""
MUNGED_DOWN = ('munge: Error: Failed to connect to "/run/munge/munge.socket.2": Connection refused\n'
               "unmunge: Error: No credential specified")
UNMUNGE_BAD_CREDENTIAL = "unmunge: Error: Failed to match armor prefix"
# Recorded `scontrol ping` (Slurm 22.05) with slurmctld running.
PING_UP = "Slurmctld(primary) at vm is UP"


def _ctx(slurm_conf):
    return NodeContext(node="vm", slurm_conf=str(slurm_conf), site=None, gres=None, gres_conf="/nonexistent",
                       vendors=set(), euid=0)


def _answer(monkeypatch, status, output):
    calls = []

    def fake_run_tool(argv, env=None, timeout=20, input=None):
        calls.append(argv)
        return status, output
    monkeypatch.setattr(node_checks, "run_tool", fake_run_tool)  # munge, slurmd -C
    monkeypatch.setattr(scontrol, "run_status", fake_run_tool)  # Slurm's commands: slurm_client's one door
    return calls


@pytest.mark.parametrize("status, output, result, needle", [
    (0, UNMUNGE_SUCCESS, PASS, "credential was encoded and decoded"),
    (2, MUNGED_DOWN, FAIL, 'Failed to connect to "/run/munge/munge.socket.2": Connection refused'),
    (8, UNMUNGE_BAD_CREDENTIAL, FAIL, "Failed to match armor prefix"),
    (127, "", FAIL, "no output"),
])
def test_munge_check_names_the_cause(monkeypatch, status, output, result, needle):
    _answer(monkeypatch, status, output)
    check = node_checks.check_munge()
    assert check.status == result and needle in check.summary, check
    if result == FAIL:
        assert "start munged" in check.action


def test_munge_check_puts_munges_own_error_before_unmunges(monkeypatch):
    # unmunge's "No credential specified" is only the echo of munge failing first
    _answer(monkeypatch, 2, MUNGED_DOWN)
    summary = node_checks.check_munge().summary
    assert summary.index("munge: Error: Failed to connect") < summary.index("unmunge: Error: No credential")


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def silent_slurm_conf(tmp_path):
    """A slurm.conf whose slurmctld and slurmd ports nobody listens on."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=doctor\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=%d\nSlurmdPort=%d\n"
                    "MessageTimeout=2\nNodeName=vm NodeAddr=127.0.0.1 CPUs=1\nPartitionName=p Nodes=vm\n"
                    % (_free_port(), _free_port()))
    return conf


def test_slurmctld_down_is_a_failure_naming_the_controller_not_the_banner(silent_slurm_conf):
    check = node_checks.check_slurmctld(_ctx(silent_slurm_conf))
    assert check.status == FAIL, check
    assert "is DOWN" in check.summary and "*" not in check.summary, check.summary
    assert "SlurmctldHost" in check.action


def test_slurmd_not_answering_is_a_failure(silent_slurm_conf):
    check = node_checks.check_slurmd(_ctx(silent_slurm_conf))
    assert check.status == FAIL and "Connection refused" in check.summary, check
    assert "start slurmd" in check.action


def test_slurmctld_up_from_a_recorded_ping(monkeypatch, silent_slurm_conf):
    calls = _answer(monkeypatch, 0, PING_UP)
    check = node_checks.check_slurmctld(_ctx(silent_slurm_conf))
    assert (check.status, check.summary) == (PASS, PING_UP)
    assert calls == [["scontrol", "ping"]]


# `scontrol ping` with the primary down and the backup answering, in the format of Slurm 22.05's
# src/scontrol/scontrol.c _ping_slurmctld (exit status 0: one controller is UP; the banner goes to root).
PING_FAILOVER = ("Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup) at ctl2 is UP\n"
                 "*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n"
                 "*****************************************\n")


def test_slurmctld_failover_to_a_backup_is_a_warning_naming_the_controller_down(monkeypatch, silent_slurm_conf):
    _answer(monkeypatch, 0, PING_FAILOVER)
    check = node_checks.check_slurmctld(_ctx(silent_slurm_conf))
    assert check.status == WARN, check
    assert check.summary == "Slurmctld(primary) at ctl1 is DOWN; Slurmctld(backup) at ctl2 is UP"
    assert check.action.startswith("restore slurmctld on ctl1 (primary)")
    _answer(monkeypatch, 0, "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is DOWN\n")
    check = node_checks.check_slurmctld(_ctx(silent_slurm_conf))
    assert check.status == WARN and check.action.startswith("restore slurmctld on ctl2 (backup)"), check


@pytest.mark.parametrize("check", [node_checks.check_slurmd, node_checks.check_slurmctld])
def test_without_slurm_conf_the_daemons_cannot_be_asked(tmp_path, check):
    result = check(_ctx(tmp_path / "absent.conf"))
    assert result.status == FAIL and "no slurm.conf at" in result.summary and "--slurm-conf" in result.action


# -- runtime -----------------------------------------------------------------------------

def test_runsc_missing_fails_every_runtime_check_with_what_to_install(monkeypatch):
    from slurmbox.sandbox import runsc

    def missing():
        raise runsc.RunscError("runsc (gVisor) is not installed on this node; install the 'runsc' package")
    monkeypatch.setattr(runsc, "find_runsc", missing)
    checks = runtime_checks.check_runtime(_ctx("/nonexistent"))
    assert [c.id for c in checks] == ["runsc.present", "runsc.version", "runsc.sandbox-start", "runsc.device-proxy"]
    assert all(c.status == FAIL for c in checks)
    assert "apt-get install runsc" in checks[0].action and "not installed" in checks[0].summary


@pytest.mark.parametrize("version, status, needle", [
    ("0.0~20221219.0", WARN, "predates systrap"),   # Debian 12's runsc (runsc --version)
    ("release-20240708.0", PASS, "runsc release 20240708"),
    ("unknown", WARN, "cannot tell the release"),
])
def test_runsc_release_check(version, status, needle):
    check = runtime_checks._version({"version": version, "platforms": ["ptrace"]})
    assert check.status == status and needle in check.summary


def test_a_sandbox_that_does_not_start_fails_with_a_debugging_step(tmp_path):
    runsc = tmp_path / "runsc"
    runsc.write_text("#!/bin/sh\necho 'running container: creating container: cannot open /dev/net/tun' >&2\n"
                     "exit 128\n")
    runsc.chmod(0o755)
    caps = {"version": "0.0~20221219.0", "platforms": ["ptrace"], "flags": []}
    checks = {c.id: c for c in runtime_checks.check_runtime(_ctx("/nonexistent"), str(runsc), caps)}
    start = checks["runsc.sandbox-start"]
    assert start.status == FAIL and "exit 128" in start.summary and "cannot open /dev/net/tun" in start.summary
    assert "--debug-log" in start.action and "--platform=ptrace" in start.action
    assert checks["runsc.present"].status == PASS and checks["runsc.device-proxy"].status == NOT_PRESENT


# -- gres.conf against the site --------------------------------------------------------------

def test_missing_gres_conf_fails_where_the_site_gives_the_node_accelerators(tmp_path):
    import os

    from slurmbox.doctor.context import GresLine, gather
    from slurmbox.doctor.device_checks import check_gres
    from slurmbox.settings.model import load_site_file

    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site-configs")
    hgx = os.path.join(examples, "hgx-h100-h200-spot.yaml")
    no_probes = {"nvidia": None, "amd": None, "rdma": None}
    ctx = gather(node="hgx-h100-001", slurm_conf=str(tmp_path / "slurm.conf"), site_config=hgx,
                 gres_conf=str(tmp_path / "gres.conf"), probes=no_probes)
    check = check_gres(ctx)
    assert check.status == FAIL and "no gres.conf at %s" % (tmp_path / "gres.conf") in check.summary
    assert "node group h100" in check.summary and "8 nvidia" in check.summary
    assert "slurmbox config render" in check.action

    ctx.gres = [GresLine("gpu", "h100", [])]  # gres.conf lines for other nodes only
    assert check_gres(ctx).status == FAIL and "no device files for node hgx-h100-001" in check_gres(ctx).summary

    cpu_only = gather(node="cpu-001", slurm_conf=str(tmp_path / "slurm.conf"),
                      site_config=os.path.join(examples, "mixed-h200-mi300x-cpu.yaml"),
                      gres_conf=str(tmp_path / "gres.conf"), probes=no_probes)
    assert check_gres(cpu_only).status == NOT_PRESENT  # no accelerators here: nothing to deploy
    assert load_site_file(hgx).node_groups["h100"].count == 8
