#!/usr/bin/env python3
"""A fake of the Google Cloud services gpuwatch calls, on loopback, written from Google's public
documents and the Compute Engine API's discovery document:

- the metadata server (`/computeMetadata/v1/...`), which refuses a request without
  `Metadata-Flavor: Google` (403) or with `X-Forwarded-For`, and answers with that header;
  the VM's service account token;
- the Compute Engine API v1 (instances get, stop, delete, setLabels with the label
  fingerprint and the limit of 64 labels, zone operations that finish after a few reads of
  their own or, when `op_seconds` is set, once that long has passed, as a real one does while
  nobody reads it), which takes only bearer tokens the fake metadata server issued and that
  have not expired, and answers errors as the API does (`{"error": {"code", "message",
  "errors": [{"message", "domain", "reason"}], "status", "details"}}`: 401 with
  `WWW-Authenticate`, a 403 for missing scopes with `ACCESS_TOKEN_SCOPE_INSUFFICIENT`, a 403
  for a missing permission, which for `compute.zoneOperations.get` names the operation, 404,
  412 for a stale fingerprint, a 400 on the `labels` field for a label set over the limit).
  A spent rate quota is a 403 with the reason `rateLimitExceeded`, as the Compute Engine API's
  rate quota document says, and an ErrorInfo saying `RATE_LIMIT_EXCEEDED`; `throttle_status:
  429` answers 429 RESOURCE_EXHAUSTED instead, and `retry_after` adds a `Retry-After`.

The fake prints `ready <metadata> <compute>` (the two ports) once it listens. Tests read and
change its state through `/_fake/state` on the compute port (GET: the state and every call;
POST: a JSON object merged into the state). Standard library only.
"""

import base64
import json
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {
    "project": "gpu-project",
    "numeric_project": "123456789012",
    "id": "4567890123456789012",
    "name": "gpu-vm-1",
    "zone": "us-central1-a",
    "machine_type": "a2-highgpu-1g",
    "provisioning_model": "STANDARD",
    "preempted": "FALSE",
    "maintenance_event": "NONE",
    "attributes": {},
    "metadata_down": False,
    # The VM's access scopes allow Compute Engine writes unless this is false.
    "scopes_ok": True,
    # Permissions the service account lacks: the API answers 403 naming one.
    "denied": [],
    # Calls answered "rate quota spent" before one goes through, by kind: stop, delete,
    # setLabels, get, operation.
    "throttle": {},
    "throttle_status": 403,
    "retry_after": None,
    "token_ttl": 3599,
    "status": "RUNNING",
    "deleted": False,
    "labels": {"team": "ml"},
    "fingerprint_generation": 1,
    "local_ssd": False,
    "accelerators": [],
    "op_polls": 2,
    "op_seconds": None,
    "op_error": None,
    "calls": [],
    "tokens": {},
    "ops": {},
}


def fingerprint():
    return base64.b64encode(("fp-%d" % STATE["fingerprint_generation"]).encode()).decode()


class Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body=None, headers=None, text=None):
        if text is not None:
            data = text.encode()
            ctype = "application/text"
        else:
            data = b"" if body is None else json.dumps(body).encode()
            ctype = "application/json; charset=UTF-8"
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def parts(self):
        url = urllib.parse.urlsplit(self.path)
        return url.path, urllib.parse.parse_qs(url.query, keep_blank_values=True)


class Metadata(Base):
    def do_GET(self):
        path, q = self.parts()
        with LOCK:
            STATE["calls"].append({"service": "metadata", "path": path,
                                   "flavor": self.headers.get("Metadata-Flavor")})
            down = STATE["metadata_down"]
        if self.headers.get("X-Forwarded-For"):
            return self.send(403, text="Forbidden")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.send(403, headers={"Metadata-Flavor": "Google"},
                             text="Missing Metadata-Flavor:Google header.")
        if down:
            return self.send(503, headers={"Metadata-Flavor": "Google"}, text="Service Unavailable")
        prefix = "/computeMetadata/v1/"
        if not path.startswith(prefix):
            return self.send(404, headers={"Metadata-Flavor": "Google"}, text="Not Found")
        key = path[len(prefix):]
        with LOCK:
            s = STATE
            values = {
                "project/project-id": s["project"],
                "project/numeric-project-id": s["numeric_project"],
                "instance/id": s["id"],
                "instance/name": s["name"],
                "instance/zone": "projects/%s/zones/%s" % (s["numeric_project"], s["zone"]),
                "instance/machine-type": "projects/%s/machineTypes/%s" % (s["numeric_project"], s["machine_type"]),
                "instance/scheduling/provisioning-model": s["provisioning_model"],
                "instance/scheduling/preemptible": "TRUE" if s["provisioning_model"] == "SPOT" else "FALSE",
                "instance/preempted": s["preempted"],
                "instance/maintenance-event": s["maintenance_event"],
            }
            for k, v in s["attributes"].items():
                values["instance/attributes/" + k] = v
        if key == "instance/service-accounts/default/token":
            with LOCK:
                token = "ya29.fake-%s" % uuid.uuid4().hex
                STATE["tokens"][token] = time.time() + STATE["token_ttl"]
                ttl = STATE["token_ttl"]
            return self.send(200, {"access_token": token, "expires_in": ttl, "token_type": "Bearer"},
                             {"Metadata-Flavor": "Google"})
        if key in values:
            return self.send(200, headers={"Metadata-Flavor": "Google"}, text=values[key])
        return self.send(404, headers={"Metadata-Flavor": "Google"}, text="Not Found")


def gerror(code, message, reason, status, details=None, domain="global"):
    e = {"code": code, "message": message,
         "errors": [{"message": message, "domain": domain, "reason": reason}], "status": status}
    if details:
        e["details"] = details
    return {"error": e}


MAX_LABELS = 64


def finish(o):
    """Ends an operation, and does what it did to the VM (with STATE locked)."""
    o["status"] = "DONE"
    if STATE["op_error"] and o["kind"] != "setLabels":
        o["error"] = STATE["op_error"]
        STATE["status"] = "RUNNING"
    elif o["kind"] == "stop":
        STATE["status"] = "TERMINATED"
    elif o["kind"] == "delete":
        STATE["deleted"] = True


def settle():
    """Ends the operations whose time has come (with STATE locked): a real operation runs
    whether or not anybody reads it."""
    after = STATE["op_seconds"]
    if after is None:
        return
    for o in STATE["ops"].values():
        if o["status"] != "DONE" and time.time() - o["created"] >= after:
            finish(o)


class Compute(Base):
    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, method):
        path, q = self.parts()
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if path == "/_fake/state":
            with LOCK:
                if method == "POST":
                    STATE.update(json.loads(raw))
                    return self.send(200, {})
                return self.send(200, STATE)
        with LOCK:
            settle()
            call = {"service": "compute", "method": method, "path": path,
                    "query": {k: v[0] for k, v in q.items()}, "body": raw.decode(errors="replace")}
            STATE["calls"].append(call)
            s = STATE
            base = "/compute/v1/projects/%s/zones/%s" % (s["project"], s["zone"])
            instance = base + "/instances/" + s["name"]
        auth = self.headers.get("Authorization") or ""
        with LOCK:
            expires = STATE["tokens"].get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        if expires is None or expires <= time.time():
            return self.send(401, gerror(401, "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
                                         "authError", "UNAUTHENTICATED"),
                             {"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'})
        if path == instance and method == "GET":
            return self.get_instance("compute.instances.get")
        if path == instance + "/stop" and method == "POST":
            return self.act("stop", q, call)
        if path == instance and method == "DELETE":
            return self.act("delete", q, call)
        if path == instance + "/setLabels" and method == "POST":
            return self.set_labels(raw, call)
        if path.startswith(base + "/operations/") and method == "GET":
            return self.operation(path.rsplit("/", 1)[1], path)
        return self.send(404, gerror(404, "The resource '%s' was not found" % path, "notFound", "NOT_FOUND"))

    def refused(self, permission, write, resource=None):
        with LOCK:
            scopes_ok = STATE["scopes_ok"]
            denied = permission in STATE["denied"]
            project, zone, name = STATE["project"], STATE["zone"], STATE["name"]
        resource = resource or "projects/%s/zones/%s/instances/%s" % (project, zone, name)
        if write and not scopes_ok:
            self.send(403, gerror(403, "Request had insufficient authentication scopes.", "insufficientPermissions", "PERMISSION_DENIED", [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
                 "domain": "googleapis.com", "metadata": {"service": "compute.googleapis.com", "method": "compute.v1.InstancesService.Stop"}}]),
                {"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", error="insufficient_scope", scope="https://www.googleapis.com/auth/compute"'})
            return True
        if denied:
            self.send(403, gerror(403, "Required '%s' permission for '%s'" % (permission, resource), "forbidden", "PERMISSION_DENIED"))
            return True
        return False

    def get_instance(self, permission):
        if self.refused(permission, False) or self.throttled("get"):
            return
        with LOCK:
            s = STATE
            if s["deleted"]:
                return self.send(404, gerror(404, "The resource 'projects/%s/zones/%s/instances/%s' was not found" % (s["project"], s["zone"], s["name"]), "notFound", "NOT_FOUND"))
            link = "https://www.googleapis.com/compute/v1/projects/%s/zones/%s" % (s["project"], s["zone"])
            disks = [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "boot": True, "autoDelete": True, "interface": "SCSI"}]
            if s["local_ssd"]:
                disks.append({"kind": "compute#attachedDisk", "type": "SCRATCH", "mode": "READ_WRITE", "autoDelete": True, "interface": "NVME"})
            body = {"kind": "compute#instance", "id": s["id"], "name": s["name"],
                    "machineType": link + "/machineTypes/" + s["machine_type"], "zone": link,
                    "status": s["status"], "labels": s["labels"], "labelFingerprint": fingerprint(),
                    "disks": disks,
                    "guestAccelerators": [{"acceleratorType": link + "/acceleratorTypes/" + a["type"], "acceleratorCount": a["count"]} for a in s["accelerators"]],
                    "scheduling": {"provisioningModel": s["provisioning_model"], "preemptible": s["provisioning_model"] == "SPOT",
                                   "onHostMaintenance": "TERMINATE", "automaticRestart": True},
                    "selfLink": link + "/instances/" + s["name"]}
        return self.send(200, body)

    def new_op(self, kind, call):
        op = "operation-%d-%s" % (int(time.time() * 1000), uuid.uuid4().hex[:8])
        STATE["ops"][op] = {"kind": kind, "reads": 0, "status": "RUNNING", "created": time.time()}
        call["operation"] = op
        s = STATE
        link = "https://www.googleapis.com/compute/v1/projects/%s/zones/%s" % (s["project"], s["zone"])
        return {"kind": "compute#operation", "id": str(uuid.uuid4().int >> 64), "name": op,
                "zone": link, "operationType": kind, "targetLink": link + "/instances/" + s["name"],
                "status": "RUNNING", "progress": 0, "selfLink": link + "/operations/" + op,
                "insertTime": time.strftime("%Y-%m-%dT%H:%M:%S.000-07:00")}

    def throttled(self, kind):
        """A spent rate quota, as Compute Engine answers it: 403 with the reason
        rateLimitExceeded in the usageLimits domain, and an ErrorInfo naming the quota."""
        with LOCK:
            n = STATE["throttle"].get(kind, 0)
            if n <= 0:
                return False
            STATE["throttle"][kind] = n - 1
            code, after = STATE["throttle_status"], STATE["retry_after"]
            numeric = STATE["numeric_project"]
        metric, limit, what = {
            "get": ("read_requests", "ReadRequestsPerMinutePerProject", "Read requests"),
            "operation": ("operation_read_requests", "OperationReadRequestsPerMinutePerProject", "Operation read requests"),
        }.get(kind, ("default", "defaultPerMinutePerProject", "Queries"))
        message = ("Quota exceeded for quota metric '%s' and limit '%s per minute' of service "
                   "'compute.googleapis.com' for consumer 'project_number:%s'." % (what, what, numeric))
        details = [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
             "domain": "googleapis.com",
             "metadata": {"service": "compute.googleapis.com", "consumer": "projects/" + numeric,
                          "quota_metric": "compute.googleapis.com/" + metric, "quota_limit": limit,
                          "quota_limit_value": "1500", "quota_location": "global"}},
            {"@type": "type.googleapis.com/google.rpc.Help",
             "links": [{"description": "Request a higher quota limit.",
                        "url": "https://cloud.google.com/docs/quotas/help/request_increase"}]},
        ]
        status = "RESOURCE_EXHAUSTED" if code == 429 else "PERMISSION_DENIED"
        headers = {"Retry-After": str(after)} if after is not None else None
        self.send(code, gerror(code, message, "rateLimitExceeded", status, details, "usageLimits"), headers)
        return True

    def act(self, kind, q, call):
        permission = {"stop": "compute.instances.stop", "delete": "compute.instances.delete"}[kind]
        if self.refused(permission, True) or self.throttled(kind):
            return
        with LOCK:
            if STATE["deleted"]:
                return self.send(404, gerror(404, "The resource was not found", "notFound", "NOT_FOUND"))
            if kind == "stop" and STATE["local_ssd"] and "discardLocalSsd" not in q:
                return self.send(400, gerror(400, "VM has a Local SSD attached but an undefined value for `discard-local-ssd`. If using gcloud, please add `--discard-local-ssd=false` or `--discard-local-ssd=true` to your command.", "badRequest", "INVALID_ARGUMENT"))
            STATE["status"] = "STOPPING" if kind == "stop" else "STOPPING"
            body = self.new_op(kind, call)
        return self.send(200, body)

    def set_labels(self, raw, call):
        if self.refused("compute.instances.setLabels", True) or self.throttled("setLabels"):
            return
        try:
            body = json.loads(raw)
            labels = body["labels"]
        except (ValueError, KeyError, TypeError):
            return self.send(400, gerror(400, "Invalid JSON payload received.", "badRequest", "INVALID_ARGUMENT"))
        with LOCK:
            if STATE.get("stale_once"):
                # Another writer changed the labels since gpuwatch read them.
                STATE["stale_once"] = False
                STATE["fingerprint_generation"] += 1
            if body.get("labelFingerprint") != fingerprint():
                return self.send(412, gerror(412, "Labels fingerprint either invalid or resource labels have changed", "conditionNotMet", "FAILED_PRECONDITION"))
            for k, v in labels.items():
                ok_key = 0 < len(k) <= 63 and k[0].islower() and all(c.islower() or c.isdigit() or c in "-_" for c in k)
                ok_value = len(v) <= 63 and all(c.islower() or c.isdigit() or c in "-_" for c in v)
                if not (ok_key and ok_value):
                    why = "Label value '%s' violates format constraints. The value can only contain lowercase letters, numeric characters, underscores and dashes. The value can be at most 63 characters long. International characters are allowed." % v
                    return self.send(400, self.labels_refused(why))
            if len(labels) > MAX_LABELS:
                why = "Resource cannot have more than %d labels." % MAX_LABELS
                return self.send(400, self.labels_refused(why))
            STATE["labels"] = dict(labels)
            STATE["fingerprint_generation"] += 1
            out = self.new_op("setLabels", call)
        return self.send(200, out)

    @staticmethod
    def labels_refused(why):
        """A refusal of the labels field, as the API words one (its message, and an ErrorInfo
        naming the field)."""
        message = "Invalid value for field 'labels': ''. " + why
        return gerror(400, message, "invalid", "INVALID_ARGUMENT", [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "INVALID_FIELD_VALUE",
             "domain": "compute.googleapis.com",
             "metadata": {"field": "labels", "reason": why, "value": ""}}])

    def operation(self, op, path):
        if self.refused("compute.zoneOperations.get", False, path.split("/compute/v1/", 1)[1]) or self.throttled("operation"):
            return
        with LOCK:
            o = STATE["ops"].get(op)
            if o is None:
                return self.send(404, gerror(404, "The resource 'operations/%s' was not found" % op, "notFound", "NOT_FOUND"))
            o["reads"] += 1
            if o["status"] != "DONE" and (o["reads"] >= STATE["op_polls"] or o["kind"] == "setLabels"):
                finish(o)
            s = STATE
            link = "https://www.googleapis.com/compute/v1/projects/%s/zones/%s" % (s["project"], s["zone"])
            body = {"kind": "compute#operation", "name": op, "operationType": o["kind"], "status": o["status"],
                    "progress": 100 if o["status"] == "DONE" else 50, "zone": link,
                    "targetLink": link + "/instances/" + s["name"], "selfLink": link + "/operations/" + op}
            if "error" in o:
                body["error"] = {"errors": [o["error"]]}
                body["httpErrorStatusCode"] = 400
                body["httpErrorMessage"] = "BAD REQUEST"
        return self.send(200, body)


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def main():
    servers = [Server(("127.0.0.1", 0), h) for h in (Metadata, Compute)]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready %d %d" % tuple(s.server_address[1] for s in servers), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
