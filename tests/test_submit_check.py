"""Submit-time refusal of transparent checkpoints for GPU jobs (slurmbox.spank_plugin.submit_check).

Unit tests of the option, directive and environment reading and of the decision, then the real
thing: sbatch/srun/salloc of the dev cluster (fake NVIDIA GPUs, runsc 20221219 without CUDA
checkpoint support) refusing before anything is queued.
"""

import os
import subprocess
import sys
import uuid

import pytest

from slurmbox.settings.compiled import PartitionPolicy, SitePolicy
from slurmbox.spank_plugin import submit_check as sc

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "runsc")


def _recorded(name):
    with open(os.path.join(DATA, name)) as handle:
        return handle.read()


RUNSC_2022 = ("/usr/bin/runsc", "20221219.0", _recorded("checkpoint-help-20221219.txt"))
RUNSC_2024 = ("/usr/bin/runsc", "20240729.0", _recorded("checkpoint-help-20240729.txt"))
# Not a recording: gVisor release-20260817.0's help rebuilt from its source (tests/data/runsc/SOURCES.md),
# a runsc with CUDA checkpoint support (checkpoint --cuda-checkpoint-path).
RUNSC_CUDA = ("/usr/bin/runsc", "20260817.0", _recorded("checkpoint-help-20260817-source.txt"))


# -- command line ---------------------------------------------------------------------------------

def test_long_short_and_abbreviated_options_are_read_as_getopt_does():
    options, operands = sc.parse_options("sbatch", [
        "-p", "spot", "--gres=gpu:1", "--sandbox", "--sandbox-checkpoint", "transparent", "-Gh100:2",
        "-vvpondemand", "--gpus-per-n=2", "-J", "-G", "job.sh", "-G", "3"])
    assert options == [("partition", "spot"), ("gres", "gpu:1"), ("gpus", "h100:2"), ("partition", "ondemand"),
                       ("gpus-per-node", "2")]
    assert operands == ["job.sh", "-G", "3"]  # '-J -G': -G is the job name; script arguments are not options


def test_double_dash_ends_options_and_optional_arguments_stay_attached():
    options, operands = sc.parse_options("srun", ["--sandbox", "-k", "--gpus-per-task=1", "--", "-p", "x"])
    assert options == [("gpus-per-task", "1")]
    assert operands == ["-p", "x"]


@pytest.mark.parametrize("argv", [["--no-such-option", "x"], ["--g=1"], ["-Y"], ["-N", "1", ":", "-N", "2"],
                                  ["--partition"], ["--hold=yes"]])
def test_unknown_ambiguous_or_heterogeneous_input_is_left_to_the_step_start(argv):
    with pytest.raises(sc.Unsupported):
        sc.parse_options("sbatch", argv)


def test_command_specific_options():
    assert sc.option_table("sbatch")["wait"] == sc.NO_ARG
    assert sc.option_table("srun")["wait"] == sc.REQUIRED
    assert "wrap" not in sc.option_table("salloc")
    assert sc.parse_options("srun", ["--wait", "5", "--gpus=1", "prog"]) == ([("gpus", "1")], ["prog"])
    with pytest.raises(sc.Unsupported):
        sc.option_table("scrontab")


# -- GPU counts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("option,value,count", [
    ("gres", "gpu", 1), ("gres", "gpu:h100", 1), ("gres", "gpu:0", 0), ("gres", "nic:1,gpu:2", 2),
    ("gres", "gres/gpu:h100:3", 3), ("gres", "none", 0), ("gres", "gpu:1(S:0)", 1), ("gres", "mps:100", 0),
    ("gpus", "2", 2), ("gpus", "h100:2,a100:1", 3), ("gpus", "0", 0), ("gpus-per-node", "h100:1", 1),
    ("gpus-per-task", "1", 1), ("gpus-per-socket", "0", 0),
    ("tres-per-task", "cpu:2,gres/gpu:1", 1), ("tres-per-task", "gres/gpu", 1), ("tres-per-task", "cpu:4", 0),
    ("partition", "gpu", 0)])
def test_gpu_count(option, value, count):
    assert sc.gpu_count(option, value) == count


# -- directives, environment, precedence ------------------------------------------------------------

def test_directive_words_follow_sbatch_quoting_and_comments():
    assert sc.split_directive(' --a="b c" d\\ e # comment') == ["--a=b c", "d e"]
    assert sc.split_directive(" -p 'spot'") == ["-p", "spot"]
    with pytest.raises(sc.Unsupported):
        sc.split_directive(' --job-name="open')


def test_directives_stop_at_the_first_command():
    body = ("#!/bin/sh\n#SBATCH --gres=gpu:h100:2 -p spot # two\n\n# plain comment\n#SLURM -G 1\n"
            "echo hi\n#SBATCH -p never\n")
    assert sc.script_directives(body, "job.sh") == [
        ("gres", "gpu:h100:2", "job.sh line 2"), ("partition", "spot", "job.sh line 2"),
        ("gpus", "1", "job.sh line 5")]
    with pytest.raises(sc.Unsupported):
        sc.script_directives("#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -N2\n")


def _reader(body):
    return lambda path, chdir: body


def test_sbatch_precedence_directives_then_environment_then_command_line():
    body = "#!/bin/sh\n#SBATCH -G 1 -p secure\n#SBATCH --gres=gpu:2\ntrue\n"
    request = sc.read_request("sbatch", ["sbatch", "job.sh"], {"SBATCH_GPUS": "0"}, _reader(body))
    assert request.gpus == [("gres", "gpu:2", "job.sh line 3")]  # SBATCH_GPUS=0 overrides the directive
    assert request.partitions == ["secure"]
    request = sc.read_request("sbatch", ["sbatch", "--gres=gpu:0", "-p", "a,b", "job.sh"],
                              {"SBATCH_PARTITION": "spot"}, _reader(body))
    assert request.gpus == [("gpus", "1", "job.sh line 2")]
    assert request.partitions == ["a", "b"] and request.partition_source == "command line"


def test_environment_variables_per_command():
    env = {"SBATCH_GPUS_PER_NODE": "1", "SALLOC_GRES": "gpu:1", "SLURM_GPUS_PER_TASK": "2",
           "SLURM_PARTITION": "spot", "SBATCH_TRES_PER_TASK": "gres/gpu:1"}
    sbatch = sc.read_request("sbatch", ["sbatch", "--wrap", "true"], env)
    assert [g[0] for g in sbatch.gpus] == ["gpus-per-node", "tres-per-task"] and sbatch.partitions == []
    salloc = sc.read_request("salloc", ["salloc", "true"], env)
    assert salloc.gpus == [("gres", "gpu:1", "SALLOC_GRES")]
    srun = sc.read_request("srun", ["srun", "true"], env)
    assert srun.gpus == [("gpus-per-task", "2", "SLURM_GPUS_PER_TASK")] and srun.partitions == ["spot"]


def test_script_on_stdin_or_unreadable_is_not_judged_and_srun_in_a_job_is_a_step():
    with pytest.raises(sc.Unsupported):
        sc.read_request("sbatch", ["sbatch", "--gpus=1"], {}, _reader("#!/bin/sh\n"))
    with pytest.raises(sc.Unsupported):
        sc.read_request("sbatch", ["sbatch", "--gpus=1", "gone.sh"], {}, _reader(None))
    assert sc.read_request("srun", ["srun", "--gpus=1", "true"], {"SLURM_JOB_ID": "7"}).existing_job
    assert sc.read_request("srun", ["srun", "--jobid=7", "--gpus=1", "true"], {}).existing_job


def test_script_reader_finds_scripts_relative_to_the_submitter_and_on_its_path(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "onpath.sh").write_text("#SBATCH -G 1\n")
    (tmp_path / "here.sh").write_text("#SBATCH -G 2\n")
    read = sc.script_reader_for(os.getpid(), {"PATH": str(tmp_path / "bin")})
    assert read(str(tmp_path / "here.sh"), None) == "#SBATCH -G 2\n"
    assert read("onpath.sh", None) == "#SBATCH -G 1\n"
    assert read("missing.sh", None) is None


# -- the decision -----------------------------------------------------------------------------------

def _site(**partitions):
    return SitePolicy(partitions=partitions)


SPOT_NVIDIA = PartitionPolicy(preemptible=True, accelerator_vendors=("nvidia",))
ONDEMAND_NVIDIA = PartitionPolicy(accelerator_vendors=("nvidia",))
SECURE = PartitionPolicy(sandbox="required")
MI300X = PartitionPolicy(sandbox="required", accelerator_vendors=("amd",))
CPU = PartitionPolicy(sandbox="forbidden")


def _request(command="sbatch", partitions=("spot",), gpus=(("gres", "gpu:1", "command line"),)):
    return sc.Request(command, list(gpus), list(partitions))


def _decide(request, options, site, runsc=RUNSC_2022, env=None, required=(), default="ondemand"):
    calls = []

    def runsc_info():
        calls.append(1)
        return runsc
    message = sc.refusal(request, options, env or {}, site, list(required), runsc_info, lambda: default)
    return message, len(calls)


def test_explicit_transparent_with_gpus_and_old_runsc_is_refused_with_what_to_do():
    message, _ = _decide(_request(), {"sandbox": "", "checkpoint": "transparent"}, _site(spot=SPOT_NVIDIA))
    assert "--sandbox-checkpoint=transparent cannot save this job's GPUs" in message
    assert "--gres=gpu:1, from the command line" in message and "partition spot" in message
    assert "no CUDA checkpoint support" in message and "20221219.0" in message
    assert "--sandbox-checkpoint=signal" in message and "--sandbox-checkpoint=none" in message


def test_signal_none_no_gpus_no_sandbox_and_steps_of_a_running_job_pass():
    site = _site(spot=SPOT_NVIDIA)
    for options in ({"sandbox": "", "checkpoint": "signal"}, {"checkpoint": "signal:USR2"},
                    {"sandbox": "", "checkpoint": "none"}, {}):
        assert _decide(_request(), options, site) == (None, 0), options
    assert _decide(_request(gpus=()), {"checkpoint": "transparent"}, site)[0] is None
    step = sc.Request("srun", [("gpus", "1", "command line")], ["spot"], existing_job=True)
    assert _decide(step, {"checkpoint": "transparent"}, site)[0] is None
    assert _decide(_request(), {"no-sandbox": ""}, site)[0] is None


def test_site_default_refuses_only_on_a_preemptible_partition_and_only_checkpointable_steps():
    site = _site(spot=SPOT_NVIDIA, ondemand=ONDEMAND_NVIDIA)
    for command in ("sbatch", "srun"):
        message, _ = _decide(_request(command), {"sandbox": ""}, site)
        assert "the default of preemptible partition spot" in message
        assert _decide(_request(command, partitions=["ondemand"]), {"sandbox": ""}, site)[0] is None  # -> none
    # salloc's allocation runs no checkpointed step, and an srun step with several tasks per node or a
    # terminal runs without checkpoints under a site default: only the explicit request is refused there.
    several = sc.Request("srun", [("gpus", "1", "command line")], ["spot"], checkpointable_step=False)
    for request in (_request("salloc"), several):
        assert _decide(request, {"sandbox": ""}, site)[0] is None
        assert _decide(request, {"sandbox": "", "checkpoint": "transparent"}, site)[0]


@pytest.mark.parametrize("argv,env,checkpointable", [
    (["srun", "prog"], {}, True), (["srun", "-N2", "-n2", "prog"], {}, True), (["srun", "-n1", "prog"], {}, True),
    (["srun", "-n4", "prog"], {}, False), (["srun", "-N2-4", "-n3", "prog"], {}, False),
    (["srun", "-n4", "--ntasks-per-node=1", "prog"], {}, True), (["srun", "--pty", "bash"], {}, False),
    (["srun", "--multi-prog", "conf"], {}, False), (["srun", "prog"], {"SLURM_NTASKS": "2"}, False),
    (["srun", "-n1", "prog"], {"SLURM_NTASKS": "2"}, True), (["srun", "prog"], {"SLURM_NTASKS_PER_NODE": "2"}, False)])
def test_srun_steps_that_the_supervisor_can_checkpoint(argv, env, checkpointable):
    assert sc.read_request("srun", argv, env).checkpointable_step is checkpointable


def test_environment_fallbacks_ask_for_the_sandbox_and_the_mode():
    site = _site(spot=SPOT_NVIDIA)
    assert _decide(_request(), {}, site, env={"SLURMBOX_SANDBOX": "1"})[0]
    assert _decide(_request(), {}, site, env={"SLURMBOX_SANDBOX": "0"})[0] is None
    assert _decide(_request(), {"sandbox": ""}, site, env={"SLURMBOX_SANDBOX_CHECKPOINT": "signal"})[0] is None
    # the option wins over its environment fallback
    assert _decide(_request(), {"sandbox": "", "checkpoint": "transparent"}, site,
                   env={"SLURMBOX_SANDBOX_CHECKPOINT": "signal"})[0]


def test_required_partition_sandboxes_without_asking_and_no_sandbox_is_not_an_escape():
    site = _site(secure=SECURE)
    message, _ = _decide(_request(partitions=["secure"]), {"checkpoint": "transparent"}, site)
    assert message and "partition secure" in message
    message, _ = _decide(_request(partitions=["secure"]), {"no-sandbox": "", "checkpoint": "transparent"}, site)
    assert message
    # the site default on a non-preemptible partition becomes "none" at the step start: runsc is not even asked
    assert _decide(_request(partitions=["secure"]), {}, site) == (None, 0)
    # plugstack's required_partitions counts as well as the site file's sandbox: required
    assert _decide(_request(partitions=["other"]), {"checkpoint": "transparent"}, _site(),
                   required=["other"])[0]
    assert _decide(_request(partitions=["cpu"]), {"sandbox": "", "checkpoint": "transparent"},
                   _site(cpu=CPU))[0] is None


def test_default_partition_is_used_when_none_is_named():
    site = _site(spot=SPOT_NVIDIA)
    assert _decide(_request(partitions=()), {"sandbox": ""}, site, default="spot")[0]
    assert _decide(_request(partitions=()), {"sandbox": ""}, site, default="ondemand")[0] is None
    assert _decide(_request(partitions=()), {"sandbox": "", "checkpoint": "transparent"}, site,
                   default=None)[0] is None


def test_any_listed_partition_that_would_refuse_refuses():
    site = _site(spot=SPOT_NVIDIA, ondemand=ONDEMAND_NVIDIA)
    message, _ = _decide(_request(partitions=["ondemand", "spot"]), {"sandbox": ""}, site)
    assert "partition spot" in message


def test_cuda_capable_runsc_lets_nvidia_through_but_never_other_vendors():
    options = {"sandbox": "", "checkpoint": "transparent"}
    assert _decide(_request(), options, _site(spot=SPOT_NVIDIA), runsc=RUNSC_CUDA)[0] is None
    assert _decide(_request(), options, _site(spot=SPOT_NVIDIA), runsc=RUNSC_2024)[0]
    message, runsc_calls = _decide(_request(partitions=["mi300x"]), options, _site(mi300x=MI300X), runsc=RUNSC_CUDA)
    assert "AMD GPUs, whose state gVisor cannot checkpoint" in message
    assert runsc_calls == 0  # no need to ask runsc about AMD
    # Partitions without node groups in the site file: no vendor is known, the runsc decides.
    assert _decide(_request(partitions=["x"]), options, _site(), runsc=RUNSC_2022)[0]
    assert _decide(_request(partitions=["x"]), options, _site(), runsc=RUNSC_CUDA)[0] is None


def test_without_runsc_on_the_submit_host_nvidia_jobs_are_left_to_the_step_start():
    options = {"sandbox": "", "checkpoint": "transparent"}
    assert _decide(_request(), options, _site(spot=SPOT_NVIDIA), runsc=None)[0] is None
    assert _decide(_request(partitions=["mi300x"]), options, _site(mi300x=MI300X), runsc=None)[0]


def test_compiled_site_policy_carries_the_partitions_accelerator_vendors():
    from slurmbox.settings.model import compile_policy

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "site-configs",
                        "mixed-h200-mi300x-cpu.yaml")
    with open(path) as handle:
        policy = compile_policy(handle.read(), path)
    assert policy.partition("h200-spot").accelerator_vendors == ("nvidia",)
    assert policy.partition("mi300x").accelerator_vendors == ("amd",)
    assert policy.partition("cpu").accelerator_vendors == ()


def test_submit_check_module_does_not_import_pydantic():
    code = ("import sys; import slurmbox.spank_plugin.submit_check as m; import slurmbox.migrate.policy; "
            "import slurmbox.settings.compiled; print('pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_internal_failure_is_a_warning_and_never_a_refusal():
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = subprocess.run([sys.executable, "-m", "slurmbox.spank_plugin.submit_check", "--pid", str(gone.pid)],
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert "warning: slurmbox could not check" in result.stderr and "Traceback" not in result.stderr


# -- the real cluster ---------------------------------------------------------------------------------

def _queued(cluster, name):
    return cluster.run(["squeue", "-h", "-n", name, "-o", "%i"], user="root").stdout.split()


def _script(workdir, text):
    path = os.path.join(workdir, "job-%s.sh" % uuid.uuid4().hex[:6])
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o755)
    return path


def _sbatch(cluster, workdir, *args, env=None):
    name = "sc-%s" % uuid.uuid4().hex[:8]
    result = cluster.run(["sbatch", "--parsable", "-J", name] + list(args), cwd=workdir, env=env)
    return name, result


def test_sbatch_refuses_transparent_gpu_job_before_queueing(cluster, workdir):
    name, result = _sbatch(cluster, workdir, "--sandbox", "--sandbox-checkpoint=transparent", "--gres=gpu:1",
                           "--wrap", "true")
    assert result.returncode != 0
    assert "sbatch: error: slurmbox: --sandbox-checkpoint=transparent cannot save this job's GPUs" in result.stderr
    assert "--sandbox-checkpoint=signal" in result.stderr and "no CUDA checkpoint support" in result.stderr
    assert result.stdout.strip() == ""  # no job id
    assert _queued(cluster, name) == []


def test_sbatch_refuses_from_directives_and_environment(cluster, workdir):
    script = _script(workdir, "#!/bin/sh\n#SBATCH --sandbox\n#SBATCH --gpus=1\n"
                              "#SBATCH --sandbox-checkpoint=transparent\ntrue\n")
    name, result = _sbatch(cluster, workdir, os.path.basename(script))
    assert result.returncode != 0 and "--gpus=1, from the %s line 3" % os.path.basename(script) in result.stderr
    assert _queued(cluster, name) == []
    # secure requires a sandbox: GPUs from SBATCH_GPUS and the mode from the environment fallback
    plain = _script(workdir, "#!/bin/sh\ntrue\n")
    name, result = _sbatch(cluster, workdir, "-p", "secure", plain,
                           env={"SBATCH_GPUS": "1", "SLURMBOX_SANDBOX_CHECKPOINT": "transparent"})
    assert result.returncode != 0 and "SBATCH_GPUS" in result.stderr and "partition secure" in result.stderr
    assert _queued(cluster, name) == []


def test_sbatch_accepts_signal_mode_with_gpus_and_transparent_without(cluster, workdir):
    script = _script(workdir, "#!/bin/sh\ntrue\n")
    accepted = []
    try:
        for args in (["--sandbox", "--sandbox-checkpoint=signal", "--gres=gpu:1"],
                     ["--sandbox", "--sandbox-checkpoint=transparent"],
                     ["--gres=gpu:1"],  # no sandbox at all: the check stays silent
                     ["-p", "secure", "--gpus=1"]):  # site default on a non-preemptible partition: none
            name, result = _sbatch(cluster, workdir, "--hold", *args, script)
            assert result.returncode == 0, (args, result.stderr)
            assert "slurmbox" not in result.stderr, (args, result.stderr)
            job = result.stdout.strip().split(";")[0]
            accepted.append(job)
            assert _queued(cluster, name) == [job]
    finally:
        if accepted:
            cluster.run(["scancel"] + accepted, user="root")


def test_sbatch_script_on_stdin_is_left_to_the_step_start(cluster, workdir):
    name = "sc-%s" % uuid.uuid4().hex[:8]
    result = cluster.run(["sbatch", "--parsable", "--hold", "-J", name], cwd=workdir,
                         input="#!/bin/sh\n#SBATCH --sandbox --sandbox-checkpoint=transparent --gpus=1\ntrue\n")
    try:
        assert result.returncode == 0 and "slurmbox" not in result.stderr, result.stderr
    finally:
        cluster.run(["scancel", "-n", name], user="root")


def test_srun_and_salloc_refuse_explicit_transparent_gpu_jobs(cluster, workdir):
    for command in (["srun"], ["salloc"]):
        name = "sc-%s" % uuid.uuid4().hex[:8]
        result = cluster.run(command + ["-J", name, "--sandbox", "--sandbox-checkpoint=transparent", "--gpus=1",
                                        "true"], cwd=workdir, timeout=60)
        assert result.returncode != 0, command
        assert "%s: error: slurmbox: --sandbox-checkpoint=transparent" % command[0] in result.stderr
        assert _queued(cluster, name) == []
