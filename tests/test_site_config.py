"""Site configuration: examples validate, mutated documents are refused with the
right key path, line and message, the compiled policy carries every field."""

import json
import os
import re

import pytest
import yaml

from slurmbox.settings import slurm_syntax
from slurmbox.settings.compiled import CheckpointStore, MeasurementPolicy, SitePolicy, load_policy
from slurmbox.settings.model import SiteConfigError, compile_policy, load_site, load_site_file

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site-configs")
EXAMPLES = sorted(name for name in os.listdir(EXAMPLES_DIR) if name.endswith(".yaml"))

SITE = """
cluster: test
profiles:
  default: {}
  strict: {network: none, allowed_networks: [none], allow_custom_image: false, allowed_mount_sources: [/data]}
partitions:
  secure: {sandbox: required, default_profile: strict}
  cpu: {sandbox: forbidden}
"""

# A small complete site used as the base of the mutation tests below.
BASE = """\
cluster: base
node_groups:
  hgx:
    nodes: gpu[01-04]
    vendor: nvidia
    model: h100
    count: 8
    devices: /dev/nvidia[0-7]
    cpus: 224
    real_memory_mb: 2000000
  mi:
    nodes: amd[1-2]
    vendor: amd
    model: mi300x
    count: 8
    cpus: 192
    real_memory_mb: 1500000
partitions:
  ondemand:
    nodes: [hgx]
    default: true
    priority_tier: 10
    sandbox: optional
  spot:
    nodes: [hgx]
    spot: true
    priority_tier: 1
    preempt_mode: requeue
    grace_time: 120
    sandbox: required
    default_profile: untrusted
    checkpoint: {mode: transparent, interval: "30:00", restore_fallback: fail}
  rocm:
    nodes: [mi]
    sandbox: required
    default_profile: rocm
profiles:
  default: {network: none}
  untrusted: {network: none, allowed_networks: [none], wall_limit: "2:00:00", memory_limit_mb: 65536}
  rocm: {network: none, allow_unproxied_devices: true}
checkpoint_store: {path: /lustre/ckpt, keep_last: 3, compression: none, min_free_mb: 10240}
measurement: {exclusive_gpus: true, clock_policy: locked, locked_sm_clock_mhz: 1755, harness_cpus: "0-3",
              sandbox_cpus: "4-111"}
"""


def _mutate(change):
    document = yaml.safe_load(BASE)
    change(document)
    return yaml.safe_dump(document, sort_keys=False)


def _problems(text):
    with pytest.raises(SiteConfigError) as err:
        load_site(text, "site.yaml")
    return err.value


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_site_configs_validate(name):
    site = load_site_file(os.path.join(EXAMPLES_DIR, name))
    assert site.profiles and site.partitions and site.node_groups
    policy = compile_policy(open(os.path.join(EXAMPLES_DIR, name)).read())
    assert set(policy.partitions) == set(site.partitions)


def test_at_least_four_examples_cover_the_vendors_and_spot():
    sites = [load_site_file(os.path.join(EXAMPLES_DIR, name)) for name in EXAMPLES]
    vendors = {g.vendor for s in sites for g in s.node_groups.values()}
    assert len(sites) >= 4
    assert {"nvidia", "amd"} <= vendors and vendors & {"tpu", "trainium"}
    assert any(len({g.vendor for g in s.node_groups.values() if g.vendor}) > 1 for s in sites), "no mixed cluster"
    assert any(p.spot for s in sites for p in s.partitions.values())


def test_base_document_is_valid_and_compiles_every_field():
    policy = compile_policy(BASE)
    spot = policy.partition("spot")
    assert (spot.preemptible, spot.checkpoint_mode, spot.checkpoint_interval_s, spot.restore_fallback) == \
        (True, "transparent", 1800, "fail")
    assert policy.partition("ondemand").preemptible is False
    assert policy.partition("ondemand").checkpoint_interval_s == 0
    assert policy.checkpoint_store == CheckpointStore("/lustre/ckpt", 3, "none", 10240)
    assert policy.measurement == MeasurementPolicy(True, "locked", 1755, "0-3", "4-111")
    assert policy.profiles["untrusted"].wall_limit_s == 7200
    assert policy.profiles["untrusted"].memory_limit_mb == 65536
    assert policy.profiles["rocm"].allow_unproxied_devices is True


def test_compiled_defaults_when_the_document_omits_sections():
    policy = compile_policy("cluster: tiny\n")
    assert policy.checkpoint_store == CheckpointStore()
    assert policy.measurement == MeasurementPolicy()
    assert policy.partition("anything").checkpoint_mode == "transparent"


@pytest.mark.parametrize("change, path, line, needle", [
    # wrong types
    (lambda d: d["node_groups"]["hgx"].update(cpus="lots"), "node_groups.hgx.cpus", None, "valid integer"),
    (lambda d: d["partitions"]["spot"].update(grace_time=[1]), "partitions.spot.grace_time", None,
     "Slurm time string"),
    (lambda d: d["partitions"]["spot"].update(sandbox="sometimes"), "partitions.spot.sandbox", None,
     "'required', 'optional' or 'forbidden'"),
    # unknown keys
    (lambda d: d["profiles"]["default"].update(netwrk="none"), "profiles.default.netwrk", None,
     "unknown key; expected one of: allow_custom_image"),
    (lambda d: d.update(clusterr="x"), "clusterr", None, "unknown key"),
    # overlapping node groups and partitions
    (lambda d: d["node_groups"]["mi"].update(nodes="gpu[04-05]"), "node_groups.mi.nodes", None,
     "node gpu04 is also in node group 'hgx'"),
    (lambda d: d["partitions"]["ondemand"].update(priority_tier=1), "partitions.ondemand.priority_tier", None,
     "overlap on 4 nodes"),
    # GPU count disagrees with the device list
    (lambda d: d["node_groups"]["hgx"].update(count=4), "node_groups.hgx.devices", None,
     "count is 4 but devices /dev/nvidia[0-7] lists 8 device files"),
    (lambda d: d["node_groups"]["hgx"].update(devices="/dev/dri/renderD[128-135]"), "node_groups.hgx.devices",
     None, "is not a nvidia device file"),
    # spot partition without preemption settings
    (lambda d: d["partitions"]["spot"].pop("grace_time"), "partitions.spot", None,
     "needs preemption settings"),
    (lambda d: d["partitions"]["spot"].pop("preempt_mode"), "partitions.spot", None,
     "needs preemption settings"),
    (lambda d: d["partitions"]["spot"].update(preempt_mode="suspend"), "partitions.spot.preempt_mode", None,
     "use requeue or cancel"),
    # a profile that is not defined
    (lambda d: d["partitions"]["spot"].update(default_profile="ghost"), "partitions.spot.default_profile", None,
     "names profile 'ghost', which is not defined under profiles"),
    (lambda d: d["partitions"]["spot"].update(allowed_profiles=["untrusted", "ghost"]),
     "partitions.spot.allowed_profiles", None, "not defined under profiles"),
    # a node group that is not defined
    (lambda d: d["partitions"]["spot"].update(nodes=["hgx", "h200"]), "partitions.spot.nodes.1", None,
     "node group 'h200' is not defined"),
    # vendor gVisor cannot proxy without the weaker mode
    (lambda d: d["partitions"]["rocm"].update(default_profile="default"), "partitions.rocm.default_profile", None,
     "gVisor cannot proxy"),
    # two default partitions, bad times, measurement rules
    (lambda d: d["partitions"]["rocm"].update(default=True), "partitions.rocm.default", None,
     "Slurm allows one default partition"),
    (lambda d: d["partitions"]["spot"]["checkpoint"].update(interval="1:2:3:4"),
     "partitions.spot.checkpoint.interval", None, "is not a Slurm time"),
    (lambda d: d["measurement"].update(sandbox_cpus="2-8"), "measurement.sandbox_cpus", None, "must be disjoint"),
    (lambda d: d["profiles"]["untrusted"].update(runsc_flags=["--network=host"]), "profiles.untrusted.runsc_flags",
     None, "--network is set by slurmbox itself"),
    (lambda d: d["profiles"]["untrusted"].update(runsc_flags=["--host-uds=all"]), "profiles.untrusted.runsc_flags",
     None, "only socket creation"),
    (lambda d: d["checkpoint_store"].update(compression="zstd"), "checkpoint_store.compression", None,
     "not supported yet"),
    (lambda d: d["checkpoint_store"].update(path="relative/dir"), "checkpoint_store.path", None,
     "expected an absolute path"),
    (lambda d: d["node_groups"]["hgx"].update(nodes="gpu[05-01]"), "node_groups.hgx.nodes", None, "downwards"),
    (lambda d: d["node_groups"]["hgx"].update(nodes="gpu=[1-2]"), "node_groups.hgx.nodes", None, "node name"),
    (lambda d: d["partitions"].update({"my part": d["partitions"].pop("rocm")}), "partitions.my part", None,
     "use letters, digits"),
    (lambda d: d["node_groups"]["hgx"].pop("cpus"), "node_groups.hgx.cpus", None, "required key is missing"),
])
def test_mutated_configs_are_rejected_with_path_line_and_reason(change, path, line, needle):
    text = _mutate(change)
    error = _problems(text)
    hits = [d for d in error.details if d[0] == path]
    assert hits, "expected a problem at %s, got %s" % (path, error.problems)
    assert any(needle in message for _, _, message in hits), hits
    if line is not None:
        assert hits[0][1] == line
    for found_path, found_line, _ in hits:
        # the line given is where that key sits in the document
        key = found_path.split(".")[-2 if needle == "required key is missing" else -1]
        if found_line and not key.isdigit():
            assert re.search(r"\b%s\b" % re.escape(key), text.splitlines()[found_line - 1])


def test_error_lines_are_compiler_style_and_lines_point_at_the_key():
    text = BASE.replace("    grace_time: 120\n", "    grace_time: soon\n")
    error = _problems(text)
    line = [n for n, l in enumerate(text.splitlines(), 1) if "grace_time: soon" in l][0]
    assert error.lines() == ["site.yaml:%d: partitions.spot.grace_time: 'soon' is not a Slurm time: expected "
                             "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or INFINITE" % line]


@pytest.mark.parametrize("text, needle", [
    ("cluster: x\n  bad: [\n", "line 2"),
    ("- just\n- a list\n", "expected a mapping"),
    ("", "empty document"),
    ("just words\n", "got str"),
    (b"\xff\xfe\x00binary", "not UTF-8"),
    ("cluster: a\ncluster: b\n", "key given twice"),
    ("cluster: !!python/object:os.system x\n", "not valid YAML"),
    ("cluster: x\nprofiles: &p {a: *p}\n", "recursive document"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join("%s: &%s [%s]\n" % (c, c, ",".join(["*" + p] * 10))
                                               for p, c in zip("abcde", "bcdef")) + "cluster: x\n",
     "expand this document to more than"),
    ("cluster: x\nprofiles: " + "[" * 3000 + "]" * 3000 + "\n", "cannot read this document"),
])
def test_files_that_are_not_yaml_mappings_get_the_same_kind_of_message(text, needle):
    assert needle in str(_problems(text))


def test_slurm_times_are_not_read_as_base_60_numbers():
    site = load_site(BASE.replace("grace_time: 120", "grace_time: 1:30"))
    assert site.partitions["spot"].grace_time == "1:30"
    assert slurm_syntax.time_seconds("1:30", "seconds") == 90
    assert slurm_syntax.time_seconds(90, "seconds") == 90
    assert slurm_syntax.time_seconds(90) == 5400
    assert slurm_syntax.time_seconds("2-00:00:00") == 172800
    assert slurm_syntax.time_seconds("UNLIMITED") == slurm_syntax.INFINITE


def test_hostlists_expand_like_slurm():
    assert slurm_syntax.expand_hostlist("gpu[001-003],cpu7") == ["gpu001", "gpu002", "gpu003", "cpu7"]
    assert slurm_syntax.expand_hostlist("r[1-2]-n[1,3]") == ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]
    for bad in ("", "n[1-", "n[3-1]", "n[a-b]", "n]"):
        with pytest.raises(slurm_syntax.SyntaxProblem):
            slurm_syntax.expand_hostlist(bad)
    with pytest.raises(slurm_syntax.SyntaxProblem, match="more than"):
        slurm_syntax.expand_hostlist("n[0-99999999]")


def test_existing_sandbox_policy_documents_still_validate():
    policy = compile_policy(SITE)
    assert policy.partition("secure").sandbox == "required"
    assert policy.partition("secure").default_profile == "strict"
    assert policy.profiles["strict"].allowed_networks == ("none",)


def test_compiled_policy_of_a_file_that_is_not_text_is_a_site_config_error(tmp_path):
    source = tmp_path / "site.yaml"
    source.write_bytes(b"\xff\xfecluster: x\n")
    with pytest.raises(SiteConfigError, match="not UTF-8 text"):
        load_policy(str(source), str(tmp_path / "cache"))


def test_compiled_policy_cache_follows_the_source(tmp_path):
    source = tmp_path / "site.yaml"
    source.write_text(SITE)
    first = load_policy(str(source), str(tmp_path / "cache"))
    assert first.partition("secure").sandbox == "required"
    source.write_text(SITE.replace("sandbox: required", "sandbox: optional"))
    assert load_policy(str(source), str(tmp_path / "cache")).partition("secure").sandbox == "optional"
    assert load_policy("", str(tmp_path)).partition("any").sandbox == "optional"
    assert SitePolicy.from_json(json.loads(json.dumps(first.to_json()))).to_json() == first.to_json()


def test_compiled_cache_round_trips_the_new_sections(tmp_path):
    source = tmp_path / "site.yaml"
    source.write_text(BASE)
    built = load_policy(str(source), str(tmp_path / "cache"))
    cached = load_policy(str(source), str(tmp_path / "cache"))  # second read comes from the JSON cache
    assert cached == built
    assert cached.checkpoint_store.keep_last == 3 and cached.partition("spot").preemptible


def test_cache_of_an_older_format_is_rebuilt(tmp_path):
    from slurmbox.settings import compiled
    source = tmp_path / "site.yaml"
    source.write_text(BASE)
    path = compiled.cache_path(str(source), str(tmp_path))
    stale = compile_policy(SITE).to_json()
    stale["format"] = 1
    stale["source_sha256"] = __import__("hashlib").sha256(BASE.encode()).hexdigest()
    with open(path, "w") as handle:
        json.dump(stale, handle)
    assert load_policy(str(source), str(tmp_path)).checkpoint_store.path == "/lustre/ckpt"


# -- property: random documents give SiteConfigError or a model, never a crash ------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = st.sampled_from(["cluster", "node_groups", "partitions", "profiles", "nodes", "vendor", "count",
                         "devices", "cpus", "real_memory_mb", "spot", "grace_time", "preempt_mode", "sandbox",
                         "default_profile", "allowed_profiles", "checkpoint", "interval", "network",
                         "measurement", "checkpoint_store", "path", "h100", "spot", "default", "x"])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2 ** 70, max_value=2 ** 70),
                     st.floats(allow_nan=True), st.text(max_size=20),
                     st.sampled_from(["n[1-2]", "gpu[001-064]", "/dev/nvidia[0-7]", "nvidia", "amd", "requeue",
                                      "1:30:00", "INFINITE", "required", "none", "n[5-1]", "[", "default"]))
_DOCUMENTS = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(_KEYS, st.integers(), st.booleans()), inner,
                                                 max_size=5)), max_leaves=30)


def _loads_or_config_error(text):
    try:
        site = load_site(text, "random.yaml")
    except SiteConfigError as err:
        assert err.problems and all(isinstance(p, str) and p for p in err.problems)
        for path, line, message in err.details:
            assert message and (line is None or line >= 1)
        return None
    compile_policy(text)  # a valid document also compiles
    from slurmbox.settings.render import RenderError, render_site
    try:  # ... and renders, or says why not
        files = render_site(site, "random.yaml", text.encode())
        assert all(t.startswith("# Generated by slurmbox config render") for t in files.values())
    except RenderError as err:
        assert str(err)
    return site


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_DOCUMENTS)
def test_random_documents_give_validation_errors_never_crashes(document):
    _loads_or_config_error(yaml.safe_dump(document, allow_unicode=True))


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_random_text_gives_validation_errors_never_crashes(text):
    _loads_or_config_error(text)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mutating_one_key_of_a_valid_site_never_crashes(data):
    document = yaml.safe_load(BASE)
    section = data.draw(st.sampled_from(["node_groups", "partitions", "profiles"]))
    name = data.draw(st.sampled_from(sorted(document[section])))
    key = data.draw(_KEYS)
    document[section][name][key] = data.draw(_SCALARS)
    _loads_or_config_error(yaml.safe_dump(document))


def test_required_partitions_of_the_examples_and_dev_cluster_allow_only_network_none_profiles():
    """Red team: the dev cluster's `secure` allowed `default` (host network). A required partition's
    profiles must keep steps off every network (issue: profile overrides on required partitions)."""
    import glob
    import re

    from slurmbox.dev_cluster import cluster as dev_cluster_module

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(dev_cluster_module.__file__).read()
    dev_site = re.search(r'site = f"""(.*?)"""', text, re.S).group(1).replace("{d}", "/tmp/x").replace(
        "{self.subnet}", "1")
    sources = [open(p).read() for p in sorted(glob.glob(os.path.join(here, "site-configs", "*.yaml")))] + [dev_site]
    assert len(sources) >= 5
    for source in sources:
        site = load_site(source)
        for name, part in site.partitions.items():
            if part.sandbox != "required":
                continue
            for profile in part.allowed_profiles or sorted(site.profiles):
                assert set(site.profiles[profile].allowed_networks) == {"none"}, (name, profile)
