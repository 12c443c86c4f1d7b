#!/usr/bin/env python3
"""A fake of the Azure services gpuwatch calls, on loopback, written from Microsoft's public
documents and REST API specifications:

- the Instance Metadata Service (the instance document, or its `compute` alone, with the VM's
  user data; managed identity tokens, for the audience asked; Scheduled Events), which refuses
  a request without `Metadata: true` or with `X-Forwarded-For`;
- Azure Resource Manager (virtual machines: get with their instance view, deallocate, delete;
  the async operation resources; the Tags API, which refuses a 51st tag; Consumption budgets),
  which takes only bearer tokens that the fake IMDS issued for its own origin and that have not
  expired, and answers errors as `{"error": {"code", "message"}}` (401 with `WWW-Authenticate`,
  403 `AuthorizationFailed` naming the action and scope, 404, 409 `OperationNotAllowed` while
  another operation runs, 429 with `Retry-After`);
- the Retail Prices API, whose filter values are case-sensitive from api-version
  2023-01-01-preview and not before.

Each service listens on a port of its own. The fake prints `ready <imds> <arm> <prices>` (the
three ports) once it listens. Tests read and change its state through `/_fake/state` on the ARM
port (GET: the state and every call made; POST: a JSON object merged into the state).

Standard library only.
"""

import base64
import json
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IMDS_VERSIONS = {
    "2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01",
    "2018-04-02", "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01",
    "2019-06-04", "2019-08-01", "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15",
    "2020-09-01", "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01",
    "2021-05-01", "2021-08-01", "2021-10-01", "2021-11-01", "2021-11-15", "2021-12-13",
    "2023-07-01", "2023-11-15", "2024-03-15", "2024-07-17", "2025-04-07",
}
EVENTS_VERSIONS = {"2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"}
COMPUTE_VERSIONS = {"2024-03-01", "2024-07-01", "2024-11-01", "2025-04-01", "2025-11-01"}
TAGS_VERSIONS = {"2019-10-01", "2020-06-01", "2021-04-01", "2022-09-01", "2024-03-01", "2024-07-01", "2025-04-01"}
BUDGETS_VERSIONS = {"2021-10-01", "2023-03-01", "2023-05-01", "2023-11-01", "2024-08-01"}
# Resource Manager's audiences in the public cloud, Azure Government and Azure China; the fake
# ARM's own origin is added at start (`ARM_ORIGIN`).
AUDIENCES = {"https://management.azure.com/", "https://management.usgovcloudapi.net/",
             "https://management.chinacloudapi.cn/"}
ARM_ORIGIN = ""
FORBIDDEN_TAG_CHARS = set('<>%&\\?/')
MAX_TAGS = 50
PRICES_VERSIONS = {"2021-10-01-preview", "2023-01-01-preview"}

LOCK = threading.Lock()
STATE = {
    "compute": {
        "azEnvironment": "AzurePublicCloud",
        "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
        "resourceGroupName": "gpu-rg",
        "name": "gpu-vm-1",
        "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        "vmSize": "Standard_NC24ads_A100_v4",
        "location": "eastus",
        "zone": "1",
        "priority": "Regular",
        "evictionPolicy": "",
        "osType": "Linux",
        "vmScaleSetName": "",
        "tagsList": [{"name": "team", "value": "ml"}],
        "additionalCapabilities": {"hibernationEnabled": "false"},
    },
    # The VM as Resource Manager has it: its power state and its tags.
    "power": "running",
    "deleted": False,
    "vm_tags": {"team": "ml"},
    # Instance metadata answers 503 while this is true.
    "imds_down": False,
    # The identity endpoint answers 500 while this is true, as when Entra ID fails.
    "token_down": False,
    # Client IDs of the user-assigned identities on the VM; "" is the system-assigned one.
    "identities": [""],
    "token_ttl": 3599,
    "events": [],
    # Scheduled Events answer 500 while this is true.
    "events_down": False,
    # Once this many reads have been answered, the next ones hang (until it is null again, or
    # for 60 s at most), as a wedged host agent's would.
    "events_hang_after": None,
    "events_reads": 0,
    # KiB of user data (before base64) in the instance document's `compute`.
    "user_data_kib": 0,
    "incarnation": 1,
    # Permissions the VM's identity lacks: ARM answers 403 AuthorizationFailed.
    "denied": [],
    # Operations answered 429 (with Retry-After) this many more times.
    "throttle": {},
    # Operations answered 409 OperationNotAllowed, another operation being in progress, this
    # many more times.
    "conflict": {},
    # Status reads before an operation ends, and how it ends.
    "op_polls": 2,
    # Answer an operation with a Location header alone (as the Delete example does), which
    # answers 202 while it runs, then 200 (or 204 for a delete).
    "location_only": False,
    "op_outcome": "Succeeded",
    # The power state a deallocate that succeeded leaves (a platform fault may leave another).
    "op_leaves": "deallocated",
    # The Linux pay-as-you-go row's price, when the catalogue has it wrong.
    "absurd_price": None,
    "budgets": {},
    "calls": [],
    "tokens": {},
    "ops": {},
}


def scope_of(c):
    return "/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachines/%s" % (
        c["subscriptionId"], c["resourceGroupName"], c["name"])


def stringify(compute):
    """IMDS gives every primitive as a string."""
    out = {}
    for k, v in compute.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (int, float)):
            out[k] = str(v)
        else:
            out[k] = v
    out["tags"] = ";".join("%s:%s" % (t["name"], t["value"]) for t in compute.get("tagsList", []))
    if "tags" in compute:
        out["tags"] = compute["tags"]
    out["resourceId"] = scope_of(compute)
    # From api-version 2021-01-01, `userData` (base64, at most 64 KiB before it).
    kib = STATE["user_data_kib"]
    out["userData"] = base64.b64encode((b"#!/bin/sh\n" * 103)[:1024] * kib).decode() if kib else ""
    return out


class Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body=None, headers=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def parts(self):
        url = urllib.parse.urlsplit(self.path)
        return url.path, urllib.parse.parse_qs(url.query, keep_blank_values=True)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""


class Imds(Base):
    def do_GET(self):
        path, q = self.parts()
        with LOCK:
            STATE["calls"].append({"service": "imds", "method": "GET", "path": path,
                                   "query": {k: v[0] for k, v in q.items()},
                                   "metadata": self.headers.get("Metadata")})
            down = STATE["imds_down"]
        if self.headers.get("Metadata") != "true" or self.headers.get("X-Forwarded-For"):
            if path.startswith("/metadata/identity"):
                return self.send(400, {"error": "invalid_request",
                                       "error_description": "Required metadata header not specified"})
            return self.send(400, {"error": "Bad request. Required metadata header not specified"})
        if down:
            return self.send(503, {"error": "Service unavailable"})
        version = q.get("api-version", [""])[0]
        if path in ("/metadata/instance", "/metadata/instance/compute"):
            if version not in IMDS_VERSIONS:
                return self.bad_version()
            with LOCK:
                compute = stringify(STATE["compute"])
            if path.endswith("/compute"):
                return self.send(200, compute)
            return self.send(200, {"compute": compute, "network": {"interface": [{
                "ipv4": {"ipAddress": [{"privateIpAddress": "10.0.0.4", "publicIpAddress": ""}],
                         "subnet": [{"address": "10.0.0.0", "prefix": "24"}]},
                "ipv6": {"ipAddress": []}, "macAddress": "000D3A4F1C2B"}]}})
        if path == "/metadata/identity/oauth2/token":
            return self.token(q, version)
        if path == "/metadata/scheduledevents":
            if version not in EVENTS_VERSIONS:
                return self.bad_version()
            self.hang()
            with LOCK:
                if STATE["events_down"]:
                    return self.send(500, {"error": "Internal server error"})
                STATE["events_reads"] += 1
                doc = {"DocumentIncarnation": STATE["incarnation"], "Events": STATE["events"]}
            return self.send(200, doc)
        return self.send(404, {"error": "Not found"})

    def hang(self):
        """Waits, once `events_hang_after` reads were answered, until it is null, for 60 s at
        most."""
        deadline = time.time() + 60
        while time.time() < deadline:
            with LOCK:
                after = STATE["events_hang_after"]
                if after is None or STATE["events_reads"] < after:
                    return
            time.sleep(0.05)

    def bad_version(self):
        return self.send(400, {
            "error": "Bad request. api-version is invalid or was not specified in the request. For more information refer to aka.ms/azureimds",
            "newest-versions": ["2025-04-07", "2024-07-17", "2024-03-15"]})

    def token(self, q, version):
        if version < "2018-02-01":
            return self.send(400, {"error": "invalid_request", "error_description": "Invalid api-version"})
        resource = q.get("resource", [""])[0]
        if resource not in AUDIENCES | {ARM_ORIGIN}:
            return self.send(400, {"error": "invalid_resource",
                                   "error_description": "AADSTS500011: The resource principal named %s was not found in the tenant" % resource})
        picks = [k for k in ("client_id", "object_id", "msi_res_id") if k in q]
        if len(picks) > 1:
            return self.send(400, {"error": "invalid_request", "error_description": "Only one of client_id, object_id, msi_res_id may be given"})
        client_id = q.get("client_id", [""])[0]
        with LOCK:
            if STATE["token_down"]:
                return self.send(500, {"error": "unknown", "error_description": "Failed to retrieve token from the Active directory. For details see logs in <file path>"})
            if client_id not in STATE["identities"]:
                return self.send(400, {"error": "invalid_request", "error_description": "Identity not found"})
            ttl = STATE["token_ttl"]
            token = "eyJ0eXAiOiJKV1Qi.fake.%s" % uuid.uuid4().hex
            now = int(time.time())
            STATE["tokens"][token] = {"expires": now + ttl, "audience": resource}
        return self.send(200, {
            "access_token": token, "refresh_token": "", "expires_in": str(ttl),
            "expires_on": str(now + ttl), "not_before": str(now - 5),
            "resource": resource, "token_type": "Bearer",
            **({"client_id": client_id} if client_id else {})})


def arm_error(code, message):
    return {"error": {"code": code, "message": message}}


class Arm(Base):
    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def do_PATCH(self):
        self.route("PATCH")

    def do_PUT(self):
        self.route("PUT")

    def route(self, method):
        path, q = self.parts()
        raw = self.body()
        if path == "/_fake/state":
            with LOCK:
                if method == "POST":
                    STATE.update(json.loads(raw))
                    return self.send(200, {})
                return self.send(200, STATE)
        lower = path.lower()
        with LOCK:
            call = {"service": "arm", "method": method, "path": path,
                    "query": {k: v[0] for k, v in q.items()},
                    "content_length": self.headers.get("Content-Length"),
                    "body": raw.decode(errors="replace")}
            STATE["calls"].append(call)
        auth = self.authenticate()
        if auth:
            return self.send(401, auth[0], {"WWW-Authenticate": auth[1]})
        if "api-version" not in q:
            return self.send(400, arm_error("MissingApiVersionParameter",
                                            "The api-version query parameter (?api-version=) is required for all requests."))
        version = q["api-version"][0]
        with LOCK:
            c = STATE["compute"]
            vm = scope_of(c).lower()
        if "/providers/microsoft.compute/locations/" in lower and "/operations/" in lower:
            return self.operation(path, version, q.get("monitor", [""])[0] == "true")
        if lower.endswith("/providers/microsoft.resources/tags/default"):
            return self.tags(method, lower[: -len("/providers/microsoft.resources/tags/default")], raw, version)
        if "/providers/microsoft.consumption/budgets/" in lower:
            return self.budget(method, path, version)
        if lower == vm and method == "GET":
            return self.get_vm(q, version)
        if lower == vm + "/deallocate" and method == "POST":
            return self.act("deallocate", q, version, call)
        if lower == vm and method == "DELETE":
            return self.act("delete", q, version, call)
        if lower == vm + "/poweroff" and method == "POST":
            return self.act("powerOff", q, version, call)
        if lower.startswith("/subscriptions/"):
            return self.send(404, arm_error("ResourceNotFound", "The Resource '%s' was not found." % path))
        return self.send(404, arm_error("InvalidResourceType", "no route"))

    def authenticate(self):
        header = self.headers.get("Authorization") or ""
        challenge = 'Bearer authorization_uri="https://login.windows.net/00000000-0000-0000-0000-000000000000", error="invalid_token", error_description="%s"'
        if not header.startswith("Bearer "):
            return (arm_error("AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing."),
                    challenge % "The authentication failed because of missing 'Authorization' header.")
        token = header[len("Bearer "):]
        with LOCK:
            issued = STATE["tokens"].get(token)
        if issued is None:
            return (arm_error("InvalidAuthenticationToken", "The access token is invalid."),
                    challenge % "The access token is invalid.")
        if issued["audience"].rstrip("/") != ARM_ORIGIN.rstrip("/"):
            return (arm_error("InvalidAuthenticationTokenAudience",
                              "The access token has been obtained for wrong audience or resource '%s'. It should exactly match with one of the allowed audiences '%s','%s'." % (issued["audience"], ARM_ORIGIN, ARM_ORIGIN.rstrip("/"))),
                    challenge % "The access token has been obtained for wrong audience or resource.")
        expires = issued["expires"]
        if expires <= time.time():
            return (arm_error("ExpiredAuthenticationToken", "The access token expiry UTC time is earlier than current UTC time."),
                    challenge % "The access token has expired.")
        return None

    def denied(self, action, scope):
        with LOCK:
            if action not in STATE["denied"]:
                return False
        self.send(403, arm_error("AuthorizationFailed",
                                 "The client '7f1c5fb6-0000-0000-0000-000000000000' with object id '9379cb34-0000-0000-0000-000000000000' does not have authorization to perform action '%s' over scope '%s' or the scope is invalid. If access was recently granted, please refresh your credentials." % (action, scope)))
        return True

    def throttled(self, op):
        with LOCK:
            n = STATE["throttle"].get(op, 0)
            if n <= 0:
                return False
            STATE["throttle"][op] = n - 1
        self.send(429, {"error": {"code": "OperationNotAllowed",
                                  "message": "The server rejected the request because too many requests have been received for this subscription.",
                                  "details": [{"code": "TooManyRequests", "target": "DeleteVM30Min"}]}},
                  {"Retry-After": "1"})
        return True

    def conflicting(self, op, name):
        with LOCK:
            n = STATE["conflict"].get(op, 0)
            if n <= 0:
                return False
            STATE["conflict"][op] = n - 1
        self.send(409, arm_error("OperationNotAllowed",
                                 "Operation '%s' is not allowed on VM '%s' since another operation is in progress." % (op, name)),
                  {"Retry-After": "1", "x-ms-request-id": str(uuid.uuid4())})
        return True

    def get_vm(self, q, version):
        if version not in COMPUTE_VERSIONS:
            return self.send(400, arm_error("InvalidApiVersionParameter", "The api-version '%s' is invalid." % version))
        if self.throttled("get"):
            return
        with LOCK:
            c = STATE["compute"]
            scope = scope_of(c)
            if STATE["deleted"]:
                return self.send(404, arm_error("ResourceNotFound", "The Resource 'Microsoft.Compute/virtualMachines/%s' under resource group '%s' was not found." % (c["name"], c["resourceGroupName"])))
            body = {"name": c["name"], "id": scope, "type": "Microsoft.Compute/virtualMachines",
                    "location": c["location"], "tags": STATE["vm_tags"],
                    "properties": {"vmId": c["vmId"], "hardwareProfile": {"vmSize": c["vmSize"]},
                                   "priority": c["priority"], "provisioningState": "Succeeded"}}
            if q.get("$expand", [""])[0] == "instanceView":
                shown = {"running": "VM running", "deallocated": "VM deallocated", "stopped": "VM stopped",
                         "deallocating": "VM deallocating", "stopping": "VM stopping"}
                body["properties"]["instanceView"] = {
                    "computerName": c["name"], "osName": "ubuntu", "osVersion": "22.04",
                    "statuses": [
                        {"code": "ProvisioningState/succeeded", "level": "Info",
                         "displayStatus": "Provisioning succeeded", "time": "2026-12-06T08:00:00.0000000+00:00"},
                        {"code": "PowerState/" + STATE["power"], "level": "Info",
                         "displayStatus": shown.get(STATE["power"], STATE["power"])}]}
        if self.denied("Microsoft.Compute/virtualMachines/read", scope):
            return
        return self.send(200, body, {"x-ms-request-id": str(uuid.uuid4())})

    def act(self, what, q, version, call):
        if version not in COMPUTE_VERSIONS:
            return self.send(400, arm_error("InvalidApiVersionParameter", "The api-version '%s' is invalid." % version))
        with LOCK:
            c = STATE["compute"]
            scope = scope_of(c)
            location = c["location"]
            sub = c["subscriptionId"]
        action = {"deallocate": "Microsoft.Compute/virtualMachines/deallocate/action",
                  "delete": "Microsoft.Compute/virtualMachines/delete",
                  "powerOff": "Microsoft.Compute/virtualMachines/powerOff/action"}[what]
        if self.denied(action, scope):
            return
        if self.throttled(what):
            return
        if self.conflicting(what, c["name"]):
            return
        if what != "delete" and self.headers.get("Content-Length") is None:
            return self.send(411, None)
        with LOCK:
            if STATE["deleted"]:
                return self.send(404, arm_error("ResourceNotFound", "The Resource 'Microsoft.Compute/virtualMachines/%s' was not found." % c["name"]))
            if what == "deallocate" and q.get("hibernate", [""])[0] == "true" and \
                    STATE["compute"]["additionalCapabilities"].get("hibernationEnabled") != "true":
                return self.send(409, arm_error("OperationNotAllowed", "Hibernation is not enabled on the virtual machine '%s'." % c["name"]))
            if STATE["power"] in ("deallocating", "deleting"):
                return self.send(409, arm_error("OperationNotAllowed", "Operation '%s' is not allowed on VM '%s' since another operation is in progress." % (what, c["name"])))
            op = str(uuid.uuid4())
            STATE["ops"][op] = {"what": what, "reads": 0, "status": "InProgress",
                                "hibernate": q.get("hibernate", [""])[0] == "true",
                                "start": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
            STATE["power"] = {"deallocate": "deallocating", "delete": "deleting", "powerOff": "stopping"}[what]
            call["operation_id"] = op
        host = "http://%s:%d" % self.server.server_address
        status_url = "%s/subscriptions/%s/providers/Microsoft.Compute/locations/%s/operations/%s?api-version=%s" % (host, sub, location, op, version)
        headers = {"Location": status_url + "&monitor=true", "Retry-After": "1", "x-ms-request-id": op}
        with LOCK:
            if not STATE["location_only"]:
                headers["Azure-AsyncOperation"] = status_url
        return self.send(202, None, headers)

    def operation(self, path, version, monitor):
        op = path.rstrip("/").split("/")[-1]
        with LOCK:
            sub = STATE["compute"]["subscriptionId"]
        if self.denied("Microsoft.Compute/locations/operations/read", "/subscriptions/%s" % sub):
            return
        with LOCK:
            o = STATE["ops"].get(op)
            if o is None:
                return self.send(404, arm_error("NotFound", "The operation was not found."))
            o["reads"] += 1
            if o["status"] == "InProgress" and o["reads"] >= STATE["op_polls"]:
                o["status"] = STATE["op_outcome"]
                if o["status"] == "Succeeded":
                    if o["what"] == "delete":
                        STATE["deleted"] = True
                        STATE["power"] = "deleted"
                    elif o["what"] == "deallocate":
                        STATE["power"] = STATE["op_leaves"]
                    else:
                        STATE["power"] = "stopped"
                else:
                    STATE["power"] = "running"
            if monitor:
                if o["status"] == "InProgress":
                    return self.send(202, None, {"Location": self.path, "Retry-After": "1"})
                if o["status"] == "Failed":
                    return self.send(500, arm_error("InternalExecutionError", "An internal execution error occurred."))
                return self.send(204 if o["what"] == "delete" else 200, None)
            body = {"name": op, "status": o["status"], "startTime": o["start"]}
            if o["status"] != "InProgress":
                body["endTime"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
            if o["status"] == "Failed":
                body["error"] = {"code": "InternalExecutionError", "message": "An internal execution error occurred."}
        return self.send(200, body, {"Retry-After": "1"})

    def tags(self, method, scope, raw, version):
        if version not in TAGS_VERSIONS:
            return self.send(400, arm_error("InvalidApiVersionParameter", "The api-version '%s' is invalid." % version))
        with LOCK:
            vm = scope_of(STATE["compute"])
        if scope != vm.lower():
            return self.send(404, arm_error("ResourceNotFound", "The Resource '%s' was not found." % scope))
        if method != "PATCH":
            return self.send(405, arm_error("MethodNotAllowed", "only PATCH is faked"))
        if self.denied("Microsoft.Resources/tags/write", vm):
            return
        if not (self.headers.get("Content-Type") or "").startswith("application/json"):
            return self.send(415, arm_error("UnsupportedMediaType", "The content media type is not supported."))
        try:
            body = json.loads(raw)
            op = body["operation"]
            tags = body["properties"]["tags"]
        except (ValueError, KeyError, TypeError):
            return self.send(400, arm_error("InvalidRequestContent", "The request content was invalid and could not be deserialized."))
        for name, value in tags.items():
            if len(name) > 512 or any(ch in FORBIDDEN_TAG_CHARS for ch in name):
                return self.send(400, arm_error("InvalidTagNameCharacters", "The tag names '%s' have reserved characters '<,>,%%,&,\\,?,/' or control characters." % name))
            if not isinstance(value, str) or len(value) > 256:
                return self.send(400, arm_error("InvalidTagValueLength", "The tag value must be a string of at most 256 characters."))
        with LOCK:
            # Tag names are matched without regard to case; a refused update changes nothing.
            after = dict(STATE["vm_tags"])
            same = lambda k: [n for n in after if n.lower() == k.lower()]
            if op == "Merge":
                for k, v in tags.items():
                    for n in same(k):
                        del after[n]
                    after[k] = v
            elif op == "Replace":
                after = dict(tags)
            elif op == "Delete":
                for k in tags:
                    for n in same(k):
                        del after[n]
            else:
                return self.send(400, arm_error("InvalidRequestContent", "operation must be Merge, Replace or Delete"))
            if len(after) > MAX_TAGS:
                # The Tags API's own words for its limit: "The specified entity can have a
                # maximum of 50 tags at the end of the operation."
                return self.send(400, arm_error("BadRequest", "The specified entity can have a maximum of %d tags at the end of the operation; it would have %d." % (MAX_TAGS, len(after))),
                                 {"x-ms-request-id": str(uuid.uuid4())})
            STATE["vm_tags"] = after
            current = dict(after)
        return self.send(200, {"id": vm + "/providers/Microsoft.Resources/tags/default", "name": "default",
                               "type": "Microsoft.Resources/tags", "properties": {"tags": current}},
                         {"x-ms-request-id": str(uuid.uuid4())})

    def budget(self, method, path, version):
        if version not in BUDGETS_VERSIONS:
            return self.send(400, arm_error("InvalidApiVersionParameter", "The api-version '%s' is invalid." % version))
        scope, name = path.split("/providers/Microsoft.Consumption/budgets/", 1) if "/providers/Microsoft.Consumption/budgets/" in path else (None, None)
        if method != "GET" or scope is None:
            return self.send(405, arm_error("MethodNotAllowed", "only GET is faked"))
        if self.denied("Microsoft.Consumption/budgets/read", scope):
            return
        with LOCK:
            b = STATE["budgets"].get(scope.lower() + "/" + name)
        if b is None:
            return self.send(404, arm_error("NotFound", "Budget '%s' not found." % name))
        return self.send(200, {"id": path, "name": name, "type": "Microsoft.Consumption/budgets",
                               "eTag": "\"1d34d012214157f\"", "properties": b})


PRICES = [
    # armSkuName, armRegionName, meterName, productName, type, retailPrice
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series", "Consumption", 3.673),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4 Spot", "Virtual Machines NCadsA100v4 Series", "Consumption", 0.7345),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4 Low Priority", "Virtual Machines NCadsA100v4 Series", "Consumption", 0.7345),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series Windows", "Consumption", 4.409),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4 Spot", "Virtual Machines NCadsA100v4 Series Windows", "Consumption", 1.4705),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series", "Reservation", 19062.0),
    ("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series", "DevTestConsumption", 3.673),
    ("Standard_NC24ads_A100_v4", "westus2", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series", "Consumption", 3.85),
]


class Prices(Base):
    def do_GET(self):
        path, q = self.parts()
        with LOCK:
            STATE["calls"].append({"service": "prices", "method": "GET", "path": path,
                                   "query": {k: v[0] for k, v in q.items()}})
        if path != "/api/retail/prices":
            return self.send(404, {"Error": "not found"})
        version = q.get("api-version", [None])[0]
        if version is not None and version not in PRICES_VERSIONS:
            return self.send(400, {"Error": {"Code": "InvalidApiVersion", "Message": "Invalid api-version"}})
        # Filter values are case-sensitive from 2023-01-01-preview; before, they were not.
        fold = (lambda v: v) if version == "2023-01-01-preview" else (lambda v: v.lower())
        conds = {}
        for clause in q.get("$filter", [""])[0].split(" and "):
            clause = clause.strip()
            if " eq " in clause:
                k, v = clause.split(" eq ", 1)
                conds[k.strip()] = v.strip().strip("'")
        currency = q.get("currencyCode", ["'USD'"])[0].strip("'")
        rate = {"USD": 1.0, "EUR": 0.92}.get(currency)
        if rate is None:
            return self.send(400, {"Error": {"Code": "InvalidCurrency", "Message": "Invalid currency code"}})
        items = []
        for sku, region, meter, product, kind, price in PRICES:
            row = {"serviceName": "Virtual Machines", "armSkuName": sku, "armRegionName": region,
                   "meterName": meter, "productName": product, "priceType": kind}
            if any(fold(row.get(k) or "") != fold(v) for k, v in conds.items()):
                continue
            with LOCK:
                if kind == "Consumption" and meter == "NC24ads A100 v4" and not product.endswith(" Windows") \
                        and STATE["absurd_price"] is not None and sku == "Standard_NC24ads_A100_v4" and region == "eastus":
                    price = STATE["absurd_price"]
            items.append({
                "currencyCode": currency, "tierMinimumUnits": 0.0,
                "retailPrice": round(price * rate, 4), "unitPrice": round(price * rate, 4),
                "armRegionName": region, "location": "US East",
                "effectiveStartDate": "2022-06-01T00:00:00Z", "meterId": str(uuid.uuid5(uuid.NAMESPACE_URL, meter + product)),
                "meterName": meter, "productId": "DZH318Z0BQ4L", "skuId": "DZH318Z0BQ4L/00ZX",
                "productName": product, "skuName": meter.replace("Standard_", ""),
                "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
                "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True, "armSkuName": sku})
        return self.send(200, {"BillingCurrency": currency, "CustomerEntityId": "Default",
                               "CustomerEntityType": "Retail", "Items": items,
                               "NextPageLink": None, "Count": len(items)})


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that went away mid-answer (a daemon stopped by its test) is no error of
        # the fake's; anything else is said.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def main():
    global ARM_ORIGIN
    servers = [Server(("127.0.0.1", 0), h) for h in (Imds, Arm, Prices)]
    ARM_ORIGIN = "http://127.0.0.1:%d/" % servers[1].server_address[1]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready %d %d %d" % tuple(s.server_address[1] for s in servers), flush=True)
    # Runs until its parent closes stdin (or kills it).
    sys.stdin.read()


if __name__ == "__main__":
    main()
