"""Spot reclaim notices (fake metadata servers on loopback speaking the AWS, GCP and Azure
formats) and maintenance evacuations moving a running sandboxed job to the other node."""

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurmbox.migrate import spot
from test_migrate_preemption import (assert_exact_sequence, counter_script, job_record, lines, running_node,
                                     submit, wait_done)

PREFIX = os.environ.get("SLURMBOX_PREFIX", "/opt/slurmbox")


class FakeMetadata:
    """A metadata server on 127.0.0.1 that answers like ``provider``'s; ``notice`` switches the reclaim on."""

    def __init__(self, provider):
        self.provider = provider
        self.notice = False
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body, ctype="text/plain"):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                if fake.provider == "gcp":
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                fake.requests.append(("PUT", self.path, dict(self.headers)))
                if fake.provider == "aws" and self.path == "/latest/api/token" and \
                        self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "TOKEN123")
                return self._send(405, "")

            def do_GET(self):
                fake.requests.append(("GET", self.path, dict(self.headers)))
                if fake.provider == "aws" and self.path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN123":
                        return self._send(401, "")
                    if not fake.notice:
                        return self._send(404, "Not Found")
                    return self._send(200, json.dumps({"action": "terminate", "time": "2026-11-29T23:59:00Z"}),
                                      "application/json")
                if fake.provider == "gcp" and self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, "missing Metadata-Flavor header")
                    return self._send(200, "TRUE" if fake.notice else "FALSE")
                if fake.provider == "azure" and self.path.startswith("/metadata/scheduledevents?api-version="):
                    if self.headers.get("Metadata") != "true":
                        return self._send(400, "{\"error\": \"Bad request\"}")
                    events = [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
                               "ResourceType": "VirtualMachine", "Resources": ["vm-n1"], "EventStatus": "Scheduled",
                               "NotBefore": "Sun, 29 Nov 2026 23:59:00 GMT", "Description": "spot eviction",
                               "EventSource": "Platform", "DurationInSeconds": -1}] if fake.notice else []
                    return self._send(200, json.dumps({"DocumentIncarnation": 2 if fake.notice else 1,
                                                       "Events": events}), "application/json")
                return self._send(404, "Not Found")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata(request):
    fake = FakeMetadata(request.param)
    yield fake
    fake.close()


@pytest.mark.parametrize("metadata", ["aws", "gcp", "azure"], indirect=True)
def test_pollers_read_each_provider_format(metadata):
    assert spot.poll(metadata.provider, metadata.url) is None
    metadata.notice = True
    notice = spot.poll(metadata.provider, metadata.url)
    assert notice.provider == metadata.provider
    assert notice.action == {"aws": "terminate", "gcp": "preempted", "azure": "Preempt"}[metadata.provider]
    if metadata.provider == "aws":  # IMDSv2: token first, then the token on the request
        assert metadata.requests[0][:2] == ("PUT", "/latest/api/token")
        assert notice.time == "2026-11-29T23:59:00Z"
    if metadata.provider == "azure":
        assert spot.poll_azure(metadata.url, resource="vm-other") is None
        assert spot.poll_azure(metadata.url, resource="vm-n1").action == "Preempt"
    assert metadata.provider in notice.reason() and "notice" in notice.reason()


def test_unreachable_or_malformed_metadata_is_an_error():
    with pytest.raises(spot.MetadataError):
        spot.poll("gcp", "http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(ValueError, match="unknown provider"):
        spot.poll("oracle", "http://127.0.0.1:9")


def _slurmbox(cluster, *args):
    env = dict(cluster.env())
    return subprocess.run([os.path.join(PREFIX, "venv", "bin", "slurmbox")] + list(args), capture_output=True,
                          text=True, env=env, timeout=300)


def _move_job(cluster, workdir, evacuate):
    """Run a counting job, evacuate its node with ``evacuate(node)``, check it finished on the other node."""
    job, out, err = submit(cluster, workdir, counter_script(os.path.join(workdir, "count.sh"), count=300))
    node = cluster.wait_for(lambda: running_node(cluster, job), timeout=60, what="job to start")
    cluster.wait_for(lambda: len(lines(out)) >= 40, timeout=120, what="40 lines")
    try:
        result = evacuate(node)
        assert result.returncode == 0, result.stdout + result.stderr
        other = cluster.wait_for(lambda: running_node(cluster, job), timeout=120,
                                 what=lambda: "job to run again: %s; %s; sinfo %s" % (
                                     result.stdout, job_record(cluster, job),
                                     cluster.run(["sinfo", "-N"], user="root").stdout))
        assert other != node
        state = job_record(cluster, job) and _node_state(cluster, node)
        assert "DRAIN" in state, state
        wait_done(cluster, job, out, count=300)
        assert_exact_sequence(out, count=300)
        errors = open(err).read()
        assert "checkpointed job %s" % job in errors and "restoring job %s" % job in errors, errors
        return result, node
    finally:
        cluster.run(["scontrol", "update", "NodeName=%s" % node, "State=RESUME"], user="root")


def _node_state(cluster, node):
    out = cluster.run(["scontrol", "-o", "show", "node", node], user="root").stdout
    return out.split("State=", 1)[1].split()[0] if "State=" in out else out


def test_spot_notice_moves_running_job_to_other_node(cluster, workdir):
    fake = FakeMetadata("aws")
    try:
        idle = _slurmbox(cluster, "spot-watch", "--provider", "aws", "--metadata-url", fake.url, "--node", "n1",
                         "--once", "--runtime-dir", cluster.runtime_dir)
        assert idle.returncode == 0 and "no reclaim notice" in idle.stdout, idle.stderr
        fake.notice = True

        def evacuate(node):
            return _slurmbox(cluster, "spot-watch", "--provider", "aws", "--metadata-url", fake.url, "--node", node,
                             "--once", "--json", "--runtime-dir", cluster.runtime_dir)

        result, node = _move_job(cluster, workdir, evacuate)
        report = json.loads(result.stdout)
        assert report["drained"] and report["reason"].startswith("slurmbox spot-watch: aws terminate notice")
        assert [s["outcome"] for s in report["steps"]] == ["requeued"], report
    finally:
        fake.close()


def test_migrate_node_moves_running_job(cluster, workdir):
    def evacuate(node):
        return _slurmbox(cluster, "migrate", "--node", node, "--reason", "kernel update", "--runtime-dir",
                         cluster.runtime_dir)

    result, node = _move_job(cluster, workdir, evacuate)
    assert "requeued" in result.stdout and "drained" in result.stdout


def test_migrate_watch_evacuates_when_the_node_is_drained(cluster, workdir):
    def evacuate(node):
        watcher = subprocess.Popen([os.path.join(PREFIX, "venv", "bin", "slurmbox"), "migrate", "--node", node,
                                    "--watch", "--interval", "0.5", "--runtime-dir", cluster.runtime_dir],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
        try:
            assert cluster.run(["scontrol", "update", "NodeName=%s" % node, "State=DRAIN", "Reason=maintenance window"],
                               user="root").returncode == 0
            out, errors = watcher.communicate(timeout=180)
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
        return subprocess.CompletedProcess(watcher.args, watcher.returncode, out, errors)

    result, node = _move_job(cluster, workdir, evacuate)
    assert "requeued" in result.stdout
