"""Spot reclaim notices from cloud metadata services, each in its provider's real format.

- **AWS** (EC2 instance metadata, IMDSv2): ``PUT /latest/api/token`` with
  ``X-aws-ec2-metadata-token-ttl-seconds`` gives a token; ``GET
  /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token``
  answers 404 until a reclaim is scheduled, then 200 with JSON
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2017-09-18T08:22:00Z"}``
  (two minutes' notice). Source: AWS EC2 User Guide, "Spot Instance
  interruption notices". Falls back to IMDSv1 (no token) when the token
  request is refused.
- **GCP**: ``GET /computeMetadata/v1/instance/preempted`` with header
  ``Metadata-Flavor: Google`` answers ``TRUE`` once the VM is being preempted
  (about 30 s notice). Source: Compute Engine docs, "Detect if a VM was preempted".
- **Azure** (Scheduled Events): ``GET /metadata/scheduledevents?api-version=2020-07-01``
  with header ``Metadata: true`` answers ``{"DocumentIncarnation": N, "Events":
  [{"EventId", "EventType": "Preempt", "ResourceType": "VirtualMachine",
  "Resources": [...], "EventStatus": "Scheduled", "NotBefore": ...}]}`` (Spot
  eviction: at least 30 s). Source: Azure docs, "Azure Metadata Service:
  Scheduled Events for Linux VMs".

Standard library (urllib) only.
"""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

#: provider -> default metadata base URL.
DEFAULT_URLS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                "azure": "http://169.254.169.254"}
AZURE_API_VERSION = "2020-07-01"


class MetadataError(RuntimeError):
    """The metadata service could not be read or answered something unexpected."""


@dataclass
class Notice:
    """A reclaim notice: ``provider``, ``action`` (terminate, stop, Preempt...), ``time`` (the
    provider's text, may be empty) and ``detail`` (the raw answer, for logs)."""

    provider: str
    action: str
    time: str = ""
    detail: str = ""

    def reason(self):
        """A drain reason for slurmctld (one line)."""
        when = " at %s" % self.time if self.time else ""
        return "slurmbox spot-watch: %s %s notice%s" % (self.provider, self.action, when)


def _request(url, headers=None, method="GET", timeout=2.0):
    """(status, body text) of one HTTP request; 404 is returned, other errors raise MetadataError."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        if err.code in (401, 403, 404, 405):
            return err.code, ""
        raise MetadataError("%s %s: HTTP %d" % (method, url, err.code))
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise MetadataError("%s %s: %s" % (method, url, getattr(err, "reason", err)))


def poll_aws(base, timeout=2.0):
    """One AWS poll: a Notice, or None when no interruption is scheduled. Raises MetadataError."""
    base = base.rstrip("/")
    status, token = _request(base + "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                             method="PUT", timeout=timeout)
    headers = {"X-aws-ec2-metadata-token": token.strip()} if status == 200 and token.strip() else {}
    status, body = _request(base + "/latest/meta-data/spot/instance-action", headers, timeout=timeout)
    if status == 404:
        return None
    if status != 200:
        raise MetadataError("AWS instance-action answered HTTP %d" % status)
    try:
        data = json.loads(body)
        return Notice("aws", str(data["action"]), str(data.get("time", "")), body.strip())
    except (ValueError, KeyError, TypeError):
        raise MetadataError("AWS instance-action is not the documented JSON: %r" % body[:200])


def poll_gcp(base, timeout=2.0):
    """One GCP poll: a Notice when ``preempted`` is TRUE, else None. Raises MetadataError."""
    status, body = _request(base.rstrip("/") + "/computeMetadata/v1/instance/preempted",
                            {"Metadata-Flavor": "Google"}, timeout=timeout)
    if status != 200:
        raise MetadataError("GCP preempted answered HTTP %d" % status)
    value = body.strip().upper()
    if value == "TRUE":
        return Notice("gcp", "preempted", "", body.strip())
    if value == "FALSE":
        return None
    raise MetadataError("GCP preempted answered %r, not TRUE or FALSE" % body[:100])


def poll_azure(base, timeout=2.0, resource=None):
    """One Azure poll: a Notice for a scheduled ``Preempt`` event (of ``resource`` when given), else None."""
    status, body = _request("%s/metadata/scheduledevents?api-version=%s" % (base.rstrip("/"), AZURE_API_VERSION),
                            {"Metadata": "true"}, timeout=timeout)
    if status != 200:
        raise MetadataError("Azure scheduled events answered HTTP %d" % status)
    try:
        events = json.loads(body).get("Events", [])
    except (ValueError, AttributeError):
        raise MetadataError("Azure scheduled events is not the documented JSON: %r" % body[:200])
    for event in events:
        if event.get("EventType") != "Preempt":
            continue
        if resource and resource not in (event.get("Resources") or []):
            continue
        return Notice("azure", "Preempt", str(event.get("NotBefore", "")), json.dumps(event))
    return None


POLLERS = {"aws": poll_aws, "gcp": poll_gcp, "azure": poll_azure}


def poll(provider, base=None, timeout=2.0):
    """One poll of ``provider`` (aws, gcp, azure) at ``base`` (default: the provider's address)."""
    if provider not in POLLERS:
        raise ValueError("unknown provider %r; expected one of %s" % (provider, ", ".join(sorted(POLLERS))))
    return POLLERS[provider](base or DEFAULT_URLS[provider], timeout=timeout)
