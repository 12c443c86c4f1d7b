#!/usr/bin/env python3
"""A fake of the Alibaba Cloud services gpuwatch calls, on loopback, written from Alibaba's
public documents ("Request syntax and signature method V3", "Instance metadata", the ECS
2014-05-26 API reference pages, "Economical mode", the ECS RAM authorization reference):

- the ECS instance metadata service in security hardening mode: `PUT /latest/api/token` with
  `X-aliyun-ecs-metadata-token-ttl-seconds` (1 to 21600, else 400), every read under
  `/latest/meta-data/` with `X-aliyun-ecs-metadata-token` (none: 403; invalid or expired:
  401), any request with `X-Forwarded-For` refused (403); the instance's identity, its spot
  termination time (404 while none is set), and the STS credentials of its instance RAM role;
- the ECS API (RPC style, version 2014-05-26) under signature V3 (`ACS3-HMAC-SHA256`): every
  parameter in the query string, the action and version in `x-acs-action` and
  `x-acs-version`. It verifies as Alibaba does: the date within 15 minutes, the nonce never
  seen before, `x-acs-content-sha256` the body's hash, the AccessKey one the metadata service
  issued, its STS token the one issued with it and unexpired, and the signature recomputed over
  the request as received. Actions: DescribeInstances, TagResources, StopInstance (economical
  mode silently falling back to KeepCharging where it does not apply, as the API reference
  says), DescribeInstanceStatus (Stopping turns Stopped after a few reads), DeleteInstance,
  DescribeSpotPriceHistory, DescribeDisks and DescribePrice (which, for the current GPU
  families, refuses a request without the system disk's category, and breaks its price into
  the instance type's and the system disk's). DescribeInstances can answer 200 without the
  instance, as an eventually consistent read does, and any action can be held back (a slow
  ECS). Errors are JSON
  `{"RequestId", "HostId", "Code", "Message", "Recommend"}` with the documented statuses
  (403 `Forbidden.RAM` for a denied action, 400 `Throttling`, 403 `IncorrectInstanceStatus`,
  404 `InvalidInstanceId.NotFound`, ...).

The fake prints `ready <metadata> <ecs>` (the two ports) once it listens. Tests read and
change its state through `/_fake/state` on the ECS port (GET: the state and every call made;
POST: a JSON object merged into the state).

Standard library only.
"""

import calendar
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "2014-05-26"
ALGORITHM = "ACS3-HMAC-SHA256"
# How far x-acs-date may be from the server's clock ("The timestamp must be within 15 minutes
# before the request is sent"; symmetric, as the document is silent on dates ahead).
DATE_WINDOW = 15 * 60
# Headers whose signature the fake insists on, besides every other x-acs-* one sent.
MUST_SIGN = ("host", "x-acs-action", "x-acs-content-sha256", "x-acs-date",
             "x-acs-signature-nonce", "x-acs-version", "x-acs-security-token")
TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~"

LOCK = threading.Lock()
STATE = {
    "instance_id": "i-bp67acfmxazb4ph0001",
    "region": "cn-hangzhou",
    "zone": "cn-hangzhou-i",
    "instance_type": "ecs.gn7i-c8g1.2xlarge",
    "owner": "1609000000000000",
    # The instance RAM role attached; "" for none (the credentials path then answers 404).
    "role": "GpuwatchRole",
    # NoSpot | SpotWithPriceLimit | SpotAsPriceGo
    "spot_strategy": "NoSpot",
    # Pending | Running | Starting | Stopping | Stopped
    "status": "Running",
    # What DescribeInstances says of a stop: "" while running, StopCharging or KeepCharging.
    "stopped_mode": "",
    # PostPaid | PrePaid
    "charge_type": "PostPaid",
    "tags": {"team": "ml"},
    # The spot instance's scheduled stop and release, yyyy-MM-ddTHH:mm:ssZ; "" for none.
    "termination_time": "",
    # The metadata service answers 503 to everything while this is true.
    "metadata_down": False,
    # RAM actions the role lacks ("ecs:StopInstance"): answered 403 Forbidden.RAM.
    "denied": [],
    # Action -> how many more calls are answered 400 Throttling.
    "throttle": {},
    # DescribeInstanceStatus reads of a Stopping instance until it reads Stopped.
    "stop_polls": 2,
    # Whether the instance supports economical mode; if not, StopCharging silently becomes
    # KeepCharging ("the system stops the instance and does not report errors").
    "economical": True,
    "spot_price": 0.85,
    "price": 4.2,
    # CNY on the China site (aliyun.com), USD on the International site (alibabacloud.com).
    "currency": "USD",
    # How long the role's STS credentials last, in seconds.
    "creds_ttl": 3600,
    "deleted": False,
    # Actions carried out whose answer is lost: the connection closes before it (a reset, a
    # timeout after ECS acted).
    "drop_answer": [],
    # Error messages quote the request's security token, as an API that echoes what it was
    # sent does.
    "quote_token": False,
    # DescribeInstances answers 200 without the instance this many more times (-1: always), as
    # an eventually consistent read, a filter that misses it or a page without it does.
    "describe_empty": 0,
    # What describe_empty becomes once StopInstance is accepted: reads that lag a change.
    "empty_after_stop": 0,
    # Actions whose answer is held back while they are listed here (at most 60 s): a slow ECS.
    "stall": [],
    # Calls held back right now.
    "stalled": 0,
    # The instance's system disk, as DescribeDisks gives it.
    "system_disk": {"Category": "cloud_essd", "Size": 100, "PerformanceLevel": "PL0"},
    # What DescribePrice adds for that system disk, per hour.
    "disk_price": 0.11,
    # The families whose price ECS gives only with SystemDisk.Category: for the current ones,
    # the default category (cloud_efficiency) is not offered, and DescribePrice without a
    # category answers InvalidSystemDiskCategory.ValueNotSupported.
    "needs_disk_category": ["gn7i", "gn7e", "gn8is", "ebmgn7e", "gn8v"],
    "calls": [],
    # Metadata tokens issued: token -> expiry (Unix seconds).
    "tokens": {},
    # STS credentials issued: AccessKeyId -> {"secret", "token", "expires"}.
    "keys": {},
    "stop_reads": 0,
}
NONCES = set()


def utc(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_utc(text):
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
    except (ValueError, TypeError):
        return None


def request_id():
    return str(uuid.uuid4()).upper()


def encode(text):
    """RFC 3986, as the signature document says: unreserved characters as they are, every other
    byte of the UTF-8 `%XX` in upper case (a space `%20`, `*` `%2A`, `~` itself)."""
    return "".join(c if c in UNRESERVED else "".join("%%%02X" % b for b in c.encode()) for c in text)


def canonical_query(pairs):
    return "&".join("%s=%s" % kv for kv in sorted((encode(k), encode(v)) for k, v in pairs))


def canonical_request(method, path, pairs, headers, body):
    """The canonical request of signature V3: the method, the encoded path (`/` for an RPC
    API), the canonical query, each signed header `name:value` (values trimmed; several values
    sorted and joined with `,`), the signed header names, the body's SHA-256. `headers` are the
    signed ones, as (lower-case name, [values]) in SignedHeaders order."""
    path = "/".join(encode(urllib.parse.unquote(seg)) for seg in path.split("/")) or "/"
    lines = "".join("%s:%s\n" % (n, ",".join(sorted(v.strip() for v in values)))
                    for n, values in headers)
    return "\n".join([method.upper(), path, canonical_query(pairs), lines,
                      ";".join(n for n, _ in headers), hashlib.sha256(body).hexdigest()])


def signature_of(canonical, secret):
    to_sign = ALGORITHM + "\n" + hashlib.sha256(canonical.encode()).hexdigest()
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()


class Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, data, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""


class Metadata(Base):
    """The instance metadata service, `http://100.100.100.200`, in security hardening mode."""

    def text(self, status, text):
        self.reply(status, text.encode(), "text/plain")

    def error(self, status):
        reason = {400: "Missing or Invalid Parameters", 401: "Unauthorized", 403: "Forbidden",
                  404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}[status]
        self.text(status, "%d - %s" % (status, reason))

    def do_PUT(self):
        self.route("PUT")

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def route(self, method):
        path = urllib.parse.urlsplit(self.path).path
        self.body()
        with LOCK:
            STATE["calls"].append({"service": "metadata", "method": method, "path": path,
                                   "token": self.headers.get(TOKEN_HEADER) is not None})
            down = STATE["metadata_down"]
        if down:
            return self.error(503)
        if self.headers.get("X-Forwarded-For") is not None:
            return self.error(403)
        if path == "/latest/api/token":
            if method != "PUT":
                return self.error(405)
            return self.token()
        if method != "GET":
            return self.error(405)
        prefix = "/latest/meta-data/"
        if not path.startswith(prefix):
            return self.error(404)
        token = self.headers.get(TOKEN_HEADER)
        if token is None:
            # Hardened mode only: "Any attempt to access metadata in normal mode returns a
            # 403 - Forbidden error."
            return self.error(403)
        with LOCK:
            expires = STATE["tokens"].get(token)
        if expires is None or expires <= time.time():
            return self.error(401)
        return self.item(path[len(prefix):])

    def token(self):
        ttl = self.headers.get(TTL_HEADER)
        try:
            seconds = int(ttl)
        except (TypeError, ValueError):
            return self.error(400)
        if not 1 <= seconds <= 21600:
            return self.error(400)
        token = "AAAA" + secrets.token_urlsafe(42)
        with LOCK:
            STATE["tokens"][token] = time.time() + seconds
        return self.text(200, token)

    def item(self, key):
        with LOCK:
            s = STATE
            values = {
                "instance-id": s["instance_id"],
                "region-id": s["region"],
                "zone-id": s["zone"],
                "instance/instance-type": s["instance_type"],
                "owner-account-id": s["owner"],
            }
            if s["termination_time"]:
                values["instance/spot/termination-time"] = s["termination_time"]
            role = s["role"]
        if role and key in ("ram/security-credentials/", "ram/security-credentials"):
            return self.text(200, role)
        if role and key == "ram/security-credentials/" + role:
            return self.credentials()
        if key in values:
            return self.text(200, values[key])
        return self.error(404)

    def credentials(self):
        now = time.time()
        key_id = "STS.N" + "".join(secrets.choice(UNRESERVED[:62]) for _ in range(24))
        secret = "".join(secrets.choice(UNRESERVED[:62]) for _ in range(44))
        token = "CAIS" + secrets.token_urlsafe(96).replace("-", "+").replace("_", "/") + "="
        with LOCK:
            expires = now + STATE["creds_ttl"]
            STATE["keys"][key_id] = {"secret": secret, "token": token, "expires": expires}
        body = {"AccessKeyId": key_id, "AccessKeySecret": secret, "Expiration": utc(expires),
                "SecurityToken": token, "LastUpdated": utc(now), "Code": "Success"}
        return self.reply(200, json.dumps(body, indent=2).encode(), "text/plain")


class Refused(Exception):
    """An ECS error answer: HTTP status, Code, Message."""

    def __init__(self, status, code, message):
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


def missing(name):
    return Refused(400, "MissingParameter",
                   "The input parameter \u201c%s\u201d that is mandatory for processing this request is not supplied." % name)


def invalid(name):
    return Refused(400, "InvalidParameter", "The specified parameter \u201c%s\u201d is not valid." % name)


INCOMPLETE = "The request signature does not conform to Aliyun standards."
NO_INSTANCE = (404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
BAD_STATUS = (403, "IncorrectInstanceStatus", "The current status of the resource does not support this operation.")


class Ecs(Base):
    """The ECS API, `https://ecs.<region>.aliyuncs.com/`, RPC style under signature V3."""

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PUT(self):
        self.route("PUT")

    def do_DELETE(self):
        self.route("DELETE")

    def send(self, status, body):
        self.reply(status, json.dumps(body).encode(), "application/json;charset=utf-8")

    def route(self, method):
        url = urllib.parse.urlsplit(self.path)
        raw = self.body()
        if url.path == "/_fake/state":
            with LOCK:
                if method == "POST":
                    STATE.update(json.loads(raw))
                    return self.send(200, {})
                return self.send(200, STATE)
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        form = []
        if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() == \
                "application/x-www-form-urlencoded":
            form = urllib.parse.parse_qsl(raw.decode(errors="replace"), keep_blank_values=True)
        q = dict(pairs + form)
        rid = request_id()
        call = {"service": "ecs", "method": method, "path": url.path,
                "action": self.headers.get("x-acs-action"),
                "version": self.headers.get("x-acs-version"),
                "query": q, "body": raw.decode(errors="replace"), "request_id": rid}
        with LOCK:
            STATE["calls"].append(call)
        # What is learnt of the call as it is answered, added to its record under the lock
        # (the state may be read meanwhile).
        note = {}
        try:
            if method not in ("GET", "POST"):
                raise Refused(405, "UnsupportedHTTPMethod", "This http method is not supported.")
            self.authenticate(method, url, pairs, raw, note)
            body = self.dispatch(call["action"], call["path"], q)
        except Refused as e:
            note.update(status=e.status, code=e.code)
            with LOCK:
                call.update(note)
                host = "ecs.%s.aliyuncs.com" % STATE["region"]
                quote = STATE["quote_token"]
            message = e.message
            if quote:
                message += " (SecurityToken %s, AccessKeyId %s)" % (
                    self.headers.get("x-acs-security-token"), note.get("key_id"))
            return self.send(e.status, {
                "RequestId": rid, "HostId": host, "Code": e.code, "Message": message,
                "Recommend": "https://api.aliyun.com/troubleshoot?q=%s&product=Ecs&requestId=%s" % (e.code, rid)})
        note.update(status=200, code=None)
        with LOCK:
            call.update(note)
            drop = call["action"] in STATE["drop_answer"]
        if drop:
            # Carried out, and the answer lost: the connection closes before it.
            self.close_connection = True
            return None
        return self.send(200, dict({"RequestId": rid}, **body))

    # Signature V3 ------------------------------------------------------------------------

    def authenticate(self, method, url, pairs, raw, note):
        h = self.headers
        auth = h.get("Authorization")
        if auth is None:
            raise Refused(400, "MissingAuthorization", "Authorization is mandatory for this action.")
        if not auth.startswith(ALGORITHM + " "):
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " Only %s is supported." % ALGORITHM)
        fields = {}
        for part in auth[len(ALGORITHM) + 1:].split(","):
            name, eq, value = part.strip().partition("=")
            if eq:
                fields[name] = value
        key_id, signed, signature = (fields.get(k) for k in ("Credential", "SignedHeaders", "Signature"))
        if not key_id or not signed or not signature:
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " Authorization needs Credential, SignedHeaders and Signature.")
        note["key_id"] = key_id
        signed_list = signed.split(";")
        note["signed_headers"] = signed_list
        for name in ("x-acs-action", "x-acs-version", "x-acs-date", "x-acs-signature-nonce",
                     "x-acs-content-sha256"):
            if h.get(name) is None:
                raise missing(name)
        if signed_list != sorted(signed_list) or any(n != n.lower() for n in signed_list):
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " SignedHeaders must be lower-case and sorted.")
        present = {k.lower() for k in h.keys()}
        # Every x-acs-* header sent (the security token among them) is signed, as are host
        # and content-type.
        must = set(MUST_SIGN) - {"x-acs-security-token"}
        must |= {n for n in present if n.startswith("x-acs-")}
        if "content-type" in present:
            must.add("content-type")
        unsigned = sorted(must - set(signed_list))
        if unsigned:
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " Not signed: %s." % ", ".join(unsigned))
        absent = sorted(n for n in signed_list if n not in present)
        if absent:
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " Signed but not sent: %s." % ", ".join(absent))
        if h.get("x-acs-version") != VERSION:
            raise Refused(400, "InvalidVersion", "Specified parameter Version is not valid.")
        date = parse_utc(h.get("x-acs-date"))
        if date is None:
            raise Refused(400, "InvalidTimeStamp.Format", "Specified time stamp or date value is not well formatted.")
        if abs(time.time() - date) > DATE_WINDOW:
            raise Refused(400, "InvalidTimeStamp.Expired", "Specified time stamp or date value is expired.")
        if h.get("x-acs-content-sha256") != hashlib.sha256(raw).hexdigest():
            raise Refused(400, "IncompleteSignature", INCOMPLETE + " x-acs-content-sha256 is not the SHA-256 of the body.")
        with LOCK:
            key = STATE["keys"].get(key_id)
        if key is None:
            raise Refused(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        if h.get("x-acs-security-token") is None:
            # Every key the fake issues is an STS one, which is nothing without its token.
            raise Refused(400, "MissingSecurityToken", "The SecurityToken is mandatory for an STS AccessKey.")
        if h.get("x-acs-security-token") != key["token"]:
            raise Refused(400, "InvalidSecurityToken.MismatchWithAccessKey",
                          "Specified SecurityToken mismatch with the AccessKey.")
        if key["expires"] <= time.time():
            raise Refused(400, "InvalidSecurityToken.Expired", "Specified SecurityToken is expired.")
        canonical = canonical_request(method, url.path, pairs,
                                      [(n, h.get_all(n, [])) for n in signed_list], raw)
        expected = signature_of(canonical, key["secret"])
        if not hmac.compare_digest(expected, signature.lower()):
            note["canonical_request"] = canonical
            raise Refused(400, "SignatureDoesNotMatch", "Specified signature does not match our calculation.")
        nonce = h.get("x-acs-signature-nonce")
        with LOCK:
            if nonce in NONCES:
                raise Refused(400, "SignatureNonceUsed", "Specified signature nonce was used already.")
            NONCES.add(nonce)

    # Actions ------------------------------------------------------------------------------

    def dispatch(self, action, path, q):
        self.stall(action)
        handler = ACTIONS.get(action)
        if handler is None:
            raise Refused(404, "InvalidAction.NotFound", "Specified api is not found, please check your url and method.")
        if path != "/":
            # RPC APIs live at `/` alone.
            raise Refused(404, "InvalidAction.NotFound", "Specified api is not found, please check your url and method.")
        with LOCK:
            if "ecs:" + action in STATE["denied"]:
                raise Refused(403, "Forbidden.RAM",
                              "User not authorized to operate on the specified resource, or this API doesn't support RAM.")
            n = STATE["throttle"].get(action, 0)
            if n > 0:
                STATE["throttle"][action] = n - 1
                raise Refused(400, "Throttling", "Request was denied due to request throttling.")
        return handler(self, q)

    def stall(self, action):
        """Holds the answer back while `action` is in `stall` (at most 60 s)."""
        with LOCK:
            if action not in STATE["stall"]:
                return
            STATE["stalled"] += 1
        deadline = time.time() + 60
        try:
            while time.time() < deadline:
                with LOCK:
                    if action not in STATE["stall"]:
                        return
                time.sleep(0.05)
        finally:
            with LOCK:
                STATE["stalled"] -= 1

    def describe_instances(self, q):
        region = need(q, "RegionId")
        ids = None
        if "InstanceIds" in q:
            try:
                ids = json.loads(q["InstanceIds"])
            except ValueError:
                raise invalid("InstanceIds")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > 100:
                raise invalid("InstanceIds")
        wanted = tag_filter(q)
        with LOCK:
            s = STATE
            found = []
            ours = not s["deleted"] and region == s["region"] and (ids is None or s["instance_id"] in ids)
            if ours and s["describe_empty"] != 0:
                # Answered as a read that missed it: 200, and no instance.
                ours = False
                if s["describe_empty"] > 0:
                    s["describe_empty"] -= 1
            if ours and all(k in s["tags"] and v in (None, s["tags"][k]) for k, v in wanted.items()):
                found.append(instance(s))
        return {"TotalCount": len(found), "PageNumber": 1, "PageSize": 10,
                "Instances": {"Instance": found}}

    def tag_resources(self, q):
        region = need(q, "RegionId")
        kind = need(q, "ResourceType")
        if kind != "instance":
            raise Refused(400, "InvalidResourceType.NotFound", "The specified resource type does not exist.")
        ids = indexed(q, "ResourceId")
        if not ids:
            raise missing("ResourceId.1")
        if len(ids) > 50:
            raise Refused(400, "InvalidResourceId.Malformed", "The specified ResourceId is more than 50.")
        tags = []
        n = 1
        while "Tag.%d.Key" % n in q or "Tag.%d.Value" % n in q:
            if "Tag.%d.Key" % n not in q:
                raise missing("Tag.%d.Key" % n)
            tags.append((q["Tag.%d.Key" % n], q.get("Tag.%d.Value" % n, "")))
            n += 1
        if not tags:
            raise missing("Tag.1.Key")
        if len(tags) > 20:
            raise Refused(400, "NumberExceed.Tags", "The maximum number of tags is exceeded.")
        for key, value in tags:
            low = key.lower()
            if not key or len(key) > 128 or low.startswith("acs:") or low.startswith("aliyun") \
                    or "http://" in low or "https://" in low:
                raise Refused(400, "InvalidTagKey.Malformed", "The specified Tag.n.Key is not valid.")
            if len(value) > 128 or "http://" in value.lower() or "https://" in value.lower():
                raise Refused(400, "InvalidTagValue.Malformed", "The specified Tag.n.Value is not valid.")
        keys = [k for k, _ in tags]
        if len(set(keys)) != len(keys):
            raise Refused(400, "Duplicate.TagKey", "The Tag.N.Key contain duplicate key.")
        if len({k.lower() for k in keys}) != len(keys):
            raise Refused(403, "TagKey.Duplication", "The TagKey has duplication with others, case-insensitive.")
        with LOCK:
            s = STATE
            if region != s["region"] or s["deleted"] or any(i != s["instance_id"] for i in ids):
                raise Refused(404, "InvalidResourceId.NotFound", "The specified ResourceIds are not found in our records.")
            if dry_run(q):
                raise dry()
            merged = dict(s["tags"])
            merged.update(dict(tags))
            if len(merged) > 20:
                raise Refused(400, "NumberExceed.Tags", "The maximum number of tags is exceeded.")
            s["tags"] = merged
        return {}

    def stop_instance(self, q):
        iid = need(q, "InstanceId")
        mode = q.get("StoppedMode", "")
        if mode not in ("", "StopCharging", "KeepCharging"):
            raise invalid("StoppedMode")
        for flag in ("ForceStop", "ConfirmStop", "DryRun", "Hibernate"):
            if q.get(flag, "false") not in ("true", "false"):
                raise invalid(flag)
        with LOCK:
            s = STATE
            if iid != s["instance_id"] or s["deleted"]:
                raise Refused(*NO_INSTANCE)
            if q.get("Hibernate") == "true":
                raise Refused(403, "HibernationConfigured.NotEnabled", "The instance is not configured with hibernation.")
            if s["status"] != "Running":
                raise Refused(*BAD_STATUS)
            if dry_run(q):
                raise dry()
            economical = s["economical"] and s["charge_type"] == "PostPaid"
            s["status"] = "Stopping"
            s["stop_reads"] = 0
            s["describe_empty"] = s["empty_after_stop"]
            s["stopped_mode"] = "StopCharging" if mode == "StopCharging" and economical else "KeepCharging"
        return {}

    def describe_instance_status(self, q):
        region = need(q, "RegionId")
        ids = indexed(q, "InstanceId")
        if len(ids) > 100:
            raise Refused(403, "InvalidParameter.TooManyInstanceIds", "The number of instance IDs exceeds 100.")
        statuses = []
        with LOCK:
            s = STATE
            if region == s["region"] and not s["deleted"] and (not ids or s["instance_id"] in ids):
                if s["status"] == "Stopping":
                    s["stop_reads"] += 1
                    if s["stop_reads"] >= s["stop_polls"]:
                        s["status"] = "Stopped"
                statuses.append({"InstanceId": s["instance_id"], "Status": s["status"]})
        return {"TotalCount": len(statuses), "PageNumber": int(q.get("PageNumber") or 1),
                "PageSize": int(q.get("PageSize") or 10),
                "InstanceStatuses": {"InstanceStatus": statuses}}

    def delete_instance(self, q):
        iid = need(q, "InstanceId")
        for flag in ("Force", "ForceStop", "TerminateSubscription", "DryRun"):
            if q.get(flag, "false") not in ("true", "false"):
                raise invalid(flag)
        with LOCK:
            s = STATE
            if iid != s["instance_id"] or s["deleted"]:
                raise Refused(*NO_INSTANCE)
            if s["status"] != "Stopped" and q.get("Force") != "true":
                raise Refused(*BAD_STATUS)
            if s["charge_type"] == "PrePaid" and q.get("TerminateSubscription") != "true":
                raise Refused(403, "ChargeTypeViolation", "The operation is not permitted due to charge type of the instance.")
            if dry_run(q):
                raise dry()
            s["deleted"] = True
        return {}

    def describe_spot_price_history(self, q):
        region = need(q, "RegionId")
        network = need(q, "NetworkType")
        itype = need(q, "InstanceType")
        if network not in ("classic", "vpc"):
            raise invalid("NetworkType")
        if q.get("OSType", "linux") not in ("linux", "windows"):
            raise invalid("OSType")
        with LOCK:
            s = STATE
            if region != s["region"]:
                raise Refused(404, "InvalidRegionId.NotFound", "The specified RegionId does not exist.")
            zone = q.get("ZoneId") or s["zone"]
            prices = []
            if itype == s["instance_type"] and zone == s["zone"] and network == "vpc":
                prices.append({"ZoneId": zone, "InstanceType": itype, "IoOptimized": "optimized",
                               "NetworkType": "vpc", "SpotPrice": s["spot_price"],
                               "OriginPrice": s["price"], "Timestamp": utc(time.time())})
            currency = s["currency"]
        return {"Currency": currency, "NextOffset": 0, "SpotPrices": {"SpotPriceType": prices}}

    def describe_price(self, q):
        region = need(q, "RegionId")
        kind = q.get("ResourceType", "instance")
        if kind != "instance":
            raise invalid("ResourceType")
        itype = need(q, "InstanceType")
        unit = q.get("PriceUnit", "Hour")
        hours = {"Hour": 1, "Week": 24 * 7, "Month": 24 * 30, "Year": 24 * 365}.get(unit)
        if hours is None:
            raise Refused(400, "InvalidPriceUnit.ValueNotSupported", "The specified PriceUnit is not valid.")
        category = q.get("SystemDisk.Category", "")
        if category not in ("", "cloud", "cloud_efficiency", "cloud_ssd", "cloud_essd", "cloud_auto", "cloud_essd_entry"):
            raise Refused(400, "InvalidSystemDiskCategory.ValueNotSupported", "The specified parameter SystemDisk.Category is not valid.")
        with LOCK:
            s = STATE
            if region != s["region"]:
                raise Refused(404, "InvalidRegionId.NotFound", "The specified RegionId does not exist.")
            if itype != s["instance_type"]:
                raise Refused(400, "InvalidInstanceType.ValueNotSupported", "The specified InstanceType does not exist or beyond the permitted range.")
            family = itype.split(".")[1].split("-")[0] if "." in itype else itype
            # Left out, the category is cloud_efficiency, which the current families do not
            # offer.
            if family in s["needs_disk_category"] and category in ("", "cloud", "cloud_efficiency"):
                raise Refused(400, "InvalidSystemDiskCategory.ValueNotSupported", "The specified parameter SystemDisk.Category is not valid.")
            spot = q.get("SpotStrategy", "NoSpot") in ("SpotAsPriceGo", "SpotWithPriceLimit") and unit == "Hour"
            price = round((s["spot_price"] if spot else s["price"]) * hours, 6)
            disk = round(s["disk_price"] * hours, 6)
            currency = s["currency"]
        total = round(price + disk, 6)
        def row(resource, value):
            return {"Resource": resource, "OriginalPrice": value, "DiscountPrice": 0.0,
                    "TradePrice": value, "SubRules": {"Rule": []}}
        return {"PriceInfo": {
            "Price": {"OriginalPrice": total, "DiscountPrice": 0.0, "TradePrice": total,
                      "Currency": currency,
                      "DetailInfos": {"DetailInfo": [row("instanceType", price), row("systemDisk", disk)]}},
            "Rules": {"Rule": []}}}

    def describe_disks(self, q):
        region = need(q, "RegionId")
        with LOCK:
            s = STATE
            disks = []
            mine = region == s["region"] and not s["deleted"]
            if mine and q.get("InstanceId", s["instance_id"]) == s["instance_id"] \
                    and q.get("DiskType", "all") in ("all", "system"):
                d = dict(s["system_disk"])
                d.update({"DiskId": "d-bp67acfmxazb4ph0002", "InstanceId": s["instance_id"],
                          "Type": "system", "RegionId": s["region"], "ZoneId": s["zone"],
                          "Status": "In_use", "DeleteWithInstance": True})
                disks.append(d)
        return {"TotalCount": len(disks), "PageNumber": 1, "PageSize": 10,
                "Disks": {"Disk": disks}}


def need(q, name):
    value = q.get(name)
    if value is None or value == "":
        raise missing(name)
    return value


def indexed(q, name):
    """`Name.1`, `Name.2`, ...: a list as RPC APIs take one."""
    out = []
    n = 1
    while "%s.%d" % (name, n) in q:
        out.append(q["%s.%d" % (name, n)])
        n += 1
    return out


def tag_filter(q):
    out = {}
    n = 1
    while "Tag.%d.Key" % n in q:
        out[q["Tag.%d.Key" % n]] = q.get("Tag.%d.Value" % n)
        n += 1
    return out


def dry_run(q):
    return q.get("DryRun") == "true"


def dry():
    return Refused(400, "DryRunOperation", "Request validation has been passed with DryRun flag set.")


def instance(s):
    locks = []
    if s["termination_time"]:
        # A spot instance about to be reclaimed is locked for recycling.
        locks.append({"LockReason": "Recycling", "LockMsg": ""})
    return {
        "InstanceId": s["instance_id"],
        "InstanceType": s["instance_type"],
        "InstanceTypeFamily": ".".join(s["instance_type"].split(".")[:2]).split("-")[0],
        "RegionId": s["region"],
        "ZoneId": s["zone"],
        "Status": s["status"],
        "SpotStrategy": s["spot_strategy"],
        "StoppedMode": s["stopped_mode"],
        "InstanceChargeType": s["charge_type"],
        "InstanceNetworkType": "vpc",
        "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in s["tags"].items()]},
        "OperationLocks": {"LockReason": locks},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
    }


ACTIONS = {
    "DescribeInstances": Ecs.describe_instances,
    "TagResources": Ecs.tag_resources,
    "StopInstance": Ecs.stop_instance,
    "DescribeInstanceStatus": Ecs.describe_instance_status,
    "DeleteInstance": Ecs.delete_instance,
    "DescribeSpotPriceHistory": Ecs.describe_spot_price_history,
    "DescribePrice": Ecs.describe_price,
    "DescribeDisks": Ecs.describe_disks,
}


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that went away mid-answer (a daemon stopped by its test) is no error of
        # the fake's; anything else is said.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def main():
    servers = [Server(("127.0.0.1", 0), h) for h in (Metadata, Ecs)]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready %d %d" % tuple(s.server_address[1] for s in servers), flush=True)
    # Runs until its parent closes stdin (or kills it).
    sys.stdin.read()


if __name__ == "__main__":
    main()
