#!/usr/bin/env python3
"""A fake Kubernetes API server for gpuwatch's tests, on loopback, written from the Kubernetes
documents: "Kubernetes API Concepts" (resource paths, verbs, resourceVersion and its list and
watch semantics, watch events and bookmarks, chunked lists with limit and continue, Tables),
the API reference of each resource it serves (tests/kubeapi/catalog.py) and of Status,
ListMeta and ObjectMeta, the authentication and authorization overviews (bearer tokens, 401,
403 and the verbs of requests), and "Update API Objects in Place Using kubectl patch" with RFC
7386 and RFC 6902 for the patch types (tests/kubeapi/patches.py). This file is the HTTP side
(routing, authentication, authorization, watches, the control port); the objects and what
requests do to them are in tests/kubeapi/store.py. It is checked with a real kubectl by
tests/kubeapi.rs.

Usage: fake_apiserver.py --cert CERT.pem --key KEY.pem --token TOKEN [--user USER]

It serves the API over HTTPS (HTTP/1.1) on one loopback port and a plain-HTTP control port on
another, prints `ready <api_port> <control_port>`, and exits when its standard input closes.

The API: core /api/v1 and grouped /apis/GROUP/VERSION paths, namespaced and cluster-wide
collections, single objects and their subresources (`status` for every type that has one,
`scale` for deployments, statefulsets and replicasets); get, list (label and field selectors,
resourceVersion with resourceVersionMatch, limit and continue), watch (newline-delimited JSON
events in chunked transfer encoding, bookmarks, sendInitialEvents, the 410 "Expired" ERROR
event for a resourceVersion older than the history kept), create (generateName), update, patch
(merge, strategic merge, JSON patch, and a rough server-side apply), delete (preconditions,
finalizers) and deletecollection; discovery (/api, /api/v1, /apis, /apis/G, /apis/G/V,
/version); Tables (the default one of the API concepts page, Name and Created At, for every
type: the real server prints richer columns for built-in types) and PartialObjectMetadata when
the Accept header asks. One global
resourceVersion counter is bumped on every write; a write that changes nothing writes nothing.
Errors are Status objects worded as the real server words them.

No controller runs: nothing happens to an object unless a client or the test does it, with one
hook (state `mirror_replicas`, on by default): when an API write changes spec.replicas of a
deployment, statefulset or replicaset, status.replicas follows, so that its Scale shows it.
There is no garbage collector (deleting an owner leaves its dependents), no namespace
controller (a namespace is removed at once), and no admission: namespaces need not exist
unless state `require_namespaces` is true.

The control port (no authentication), for tests:
- GET /_fake/state: `objects` keyed by API path, `calls` (every API call: method, path, query,
  verb, content_type, accept, body, code, user_agent), `rv`, `compacted`, `watches` (the open
  ones), and the settable keys below.
- POST /_fake/state: merges a JSON object's top-level keys into the state: `tokens` (accepted
  bearer tokens), `user` (the name the token authenticates as), `anonymous` (a request without
  a token is system:anonymous, else 401), `denied` (rules {verb, group, resource (with
  "/subresource"), namespace, name}, each optional but verb, group and resource "*" when
  missing: a matching request is forbidden; a rule with a namespace also denies the
  cluster-wide request), `conflicts` (object paths: before the next write to one, the fake
  writes it as a concurrent writer would, bumping its resourceVersion, and then handles the
  write as usual, so a write that carries the old resourceVersion gets 409; an entry
  {"path": ..., "force": true} answers that write 409 whatever it carries), `fail` (rules
  {method, verb, path (a trailing * matches a prefix), code (500), message, retry_after, times}
  answered with a Status of that code), `latency_ms`, `mirror_replicas`, `bookmark_seconds`,
  `require_namespaces`.
- PUT /_fake/object: creates or replaces an object as another client would (a new
  resourceVersion, uid and creationTimestamp kept or made, a watch event), answering it.
- DELETE /_fake/object?path=P: removes it at once (finalizers ignored), with a DELETED event.
- POST /_fake/compact[?rv=N]: forgets the history up to N (the current resourceVersion by
  default), as etcd's compaction does, and ends every open watch.
- DELETE /_fake/calls: forgets the calls recorded so far.
Standard library only.
"""

import sys

sys.dont_write_bytecode = True  # noqa: E402 (no __pycache__ beside the test files)

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
import uuid  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalog  # noqa: E402
from catalog import qualified  # noqa: E402
from store import (  # noqa: E402
    HIDDEN, LOCK, MAX_BODY, MAX_WATCH_SECONDS, NO_RESOURCE, STATE, ApiError, bad_request,
    commit, details, fail, go_duration, list_objects, not_found, parse_rv, present, put_object,
    scale_of, status, write,
)

SOCKET_TIMEOUT = 30
MAX_CALLS = 100000
PUBLIC_PATHS = {"/version", "/healthz", "/livez", "/readyz"}


# --- Selectors and requests -------------------------------------------------------------------

def parse_route(path):
    """(group, version, namespace, resource, name, subresource) of a resource path, or None."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        ns, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    return (group, version, ns, rest[0], rest[1] if len(rest) > 1 else None,
            rest[2] if len(rest) > 2 else None)


def media(accept):
    """What the Accept header asks for: "json", "table:v1", "table:v1beta1" or "partial";
    None when it accepts nothing this fake serves."""
    if not accept:
        return "json"
    for item in accept.split(","):
        parts = [p.strip() for p in item.split(";")]
        mtype, params = parts[0].lower(), dict(
            p.split("=", 1) for p in parts[1:] if "=" in p)
        if mtype not in ("application/json", "application/*", "*/*"):
            continue
        as_ = params.get("as")
        if as_ is None:
            return "json"
        if params.get("g") != "meta.k8s.io":
            continue
        if as_ == "Table" and params.get("v") in ("v1", "v1beta1"):
            return "table:" + params["v"]
        if as_ in ("PartialObjectMetadata", "PartialObjectMetadataList") and \
                params.get("v") in ("v1", "v1beta1"):
            return "partial"
    return None


class Request:
    """A parsed API request to a resource."""

    def __init__(self, method, route, query):
        self.group, self.version, self.ns, self.plural, self.name, self.sub = route
        self.method, self.query = method, query
        self.res = catalog.find(self.group, self.version, self.plural)
        res = self.res
        if res is None:
            raise ApiError(404, NO_RESOURCE)
        if res["plural"] == "namespaces" and self.name:
            self.ns = self.name  # the namespace of a request about a namespace is itself
        elif not res["namespaced"] and self.ns is not None:
            raise ApiError(404, NO_RESOURCE)
        if res["namespaced"] and self.name and self.ns is None:
            raise ApiError(404, NO_RESOURCE)
        if self.sub and self.sub not in res["subresources"]:
            raise ApiError(404, NO_RESOURCE)
        watch = query.get("watch") in ("true", "1")
        verbs = {"GET": "watch" if watch else ("get" if self.name else "list"),
                 "POST": "create", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete" if self.name else "deletecollection"}
        self.verb = verbs.get(method)
        if self.verb is None or (method in ("PUT", "PATCH", "POST") and
                                 bool(self.name) != (method != "POST")):
            raise fail(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")
        if self.sub and self.verb not in ("get", "update", "patch"):
            raise fail(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")

    def path(self, name=None):
        return catalog.object_path(self.res, self.ns, name or self.name)

    def in_scope(self, path, obj):
        """Whether a stored object belongs to this request's collection."""
        meta = obj.get("metadata", {})
        if self.res["namespaced"] and self.ns and meta.get("namespace") != self.ns:
            return False
        if self.name and meta.get("name") != self.name:
            return False
        return path == catalog.object_path(self.res, meta.get("namespace"), meta.get("name"))

    def selectors(self):
        try:
            self.labels = catalog.parse_labels(self.query.get("labelSelector", ""))
            self.fields = catalog.parse_fields(self.query.get("fieldSelector", ""), self.res)
        except catalog.SelectorError as e:
            raise bad_request(str(e)) from None

    def matches(self, obj):
        return obj is not None and catalog.match_labels(
            self.labels, obj.get("metadata", {}).get("labels")) and \
            catalog.match_fields(self.fields, obj)


def forbidden_check(req, user, rules):
    """The authorizer: a request matching one of `rules` is forbidden, worded as the real
    server's RBAC refusal."""
    resource = req.plural + ("/" + req.sub if req.sub else "")
    for rule in rules:
        if rule.get("verb", "*") not in ("*", req.verb) or \
                rule.get("group", "*") not in ("*", req.group) or \
                rule.get("resource", "*") not in ("*", resource):
            continue
        if rule.get("namespace") is not None and req.ns and rule["namespace"] != req.ns:
            continue
        if rule.get("name") is not None and rule["name"] != req.name:
            continue
        who = 'User "%s" cannot %s resource "%s" in API group "%s"' % (
            user, req.verb, resource, req.group)
        where = ' in the namespace "%s"' % req.ns if req.ns else " at the cluster scope"
        what = qualified(req.res) + (' "%s"' % req.name if req.name else "")
        return fail(403, "Forbidden", "%s is forbidden: %s%s" % (what, who, where),
                    details(req.res, req.name))
    return None


def injected_failure(method, path, verb):
    for rule in list(STATE["fail"]):
        if rule.get("method") not in (None, method) or rule.get("verb") not in (None, verb):
            continue
        want = rule.get("path")
        if want is not None and not (path == want or (want.endswith("*") and
                                                      path.startswith(want[:-1]))):
            continue
        if rule.get("times") is not None:
            rule["times"] -= 1
            if rule["times"] <= 0:
                STATE["fail"].remove(rule)
        code = rule.get("code", 500)
        reason, message = {
            429: ("TooManyRequests", "Too many requests, please try again later."),
            503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
            504: ("Timeout", "The server was unable to return a response in the time "
                             "allotted, but may still be processing the request"),
        }.get(code, ("InternalError", "Internal error occurred: injected by the test"))
        headers = {}
        if rule.get("retry_after") is not None:
            headers["Retry-After"] = str(rule["retry_after"])
        body = status(code, reason, rule.get("message", message))
        if rule.get("retry_after") is not None:
            body["details"] = {"retryAfterSeconds": rule["retry_after"]}
        return ApiError(code, body, headers)
    return None


# --- HTTP -------------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT

    def log_message(self, *args):
        pass

    def send_json(self, code, body, headers=None, call=None):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        if call is not None:
            with LOCK:
                call["code"] = code

    def read_body(self):
        """The request body, or None when it is over MAX_BODY (after answering 413)."""
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                if len(data) + size > MAX_BODY:
                    return None
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            # Read (up to a bound) so that the client sees the answer rather than a reset.
            left = n if n <= 4 * MAX_BODY else 0
            while left > 0:
                got = self.rfile.read(min(left, 1 << 16))
                if not got:
                    break
                left -= len(got)
            return None
        return self.rfile.read(n) if n else b""


class ApiHandler(Handler):
    def do_GET(self):
        self.handle_api("GET")

    def do_POST(self):
        self.handle_api("POST")

    def do_PUT(self):
        self.handle_api("PUT")

    def do_PATCH(self):
        self.handle_api("PATCH")

    def do_DELETE(self):
        self.handle_api("DELETE")

    def handle_api(self, method):
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query,
                                                           keep_blank_values=True).items()}
        raw = self.read_body()
        ctype = self.headers.get("Content-Type")
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None if raw is None else raw.decode(errors="replace")
        call = {"method": method, "path": path, "query": query, "verb": None,
                "content_type": ctype, "accept": self.headers.get("Accept"), "body": parsed,
                "code": None, "user_agent": self.headers.get("User-Agent")}
        with LOCK:
            STATE["calls"].append(call)
            del STATE["calls"][:-MAX_CALLS]
        if raw is None:
            self.close_connection = True
            return self.send_json(413, status(413, "RequestEntityTooLarge",
                                              "Request entity too large: limit is %d"
                                              % MAX_BODY), call=call)
        try:
            self.dispatch(method, path, query, raw, ctype, call)
        except ApiError as e:
            self.send_json(e.code, e.body, e.headers, call)
        except (OSError, ValueError) as e:
            if isinstance(e, (ConnectionError, socket.timeout)):
                raise
            self.internal_error(e, call)
        except Exception as e:  # a bug of the fake: answered, and shown on stderr
            self.internal_error(e, call)

    def internal_error(self, e, call):
        import traceback
        traceback.print_exc()
        self.send_json(500, status(500, "InternalError", "Internal error occurred: %r" % e),
                       call=call)

    def authenticate(self):
        auth = self.headers.get("Authorization")
        with LOCK:
            tokens, user, anonymous = STATE["tokens"], STATE["user"], STATE["anonymous"]
        if auth is None and anonymous:
            return "system:anonymous"
        if auth and auth.startswith("Bearer ") and auth[len("Bearer "):].strip() in tokens:
            return user
        raise fail(401, "Unauthorized", "Unauthorized")

    def dispatch(self, method, path, query, raw, ctype, call):
        user = self.authenticate()
        route = parse_route(path)
        with LOCK:
            latency = STATE["latency_ms"]
        if latency:
            time.sleep(latency / 1000)
        if route is None:
            return self.non_resource(method, path, user, call)
        req = Request(method, route, query)
        with LOCK:
            call["verb"] = req.verb
            # Nothing grants system:anonymous a resource.
            rules = [{}] if user == "system:anonymous" else STATE["denied"]
            err = forbidden_check(req, user, rules)
            if err is None:
                err = injected_failure(method, path, req.verb)
        if err is not None:
            raise err
        if req.verb in ("get", "list", "watch"):
            want = media(self.headers.get("Accept"))
            if want is None:
                raise fail(406, "NotAcceptable", "only the following media types are "
                           "accepted: application/json, application/yaml, "
                           "application/vnd.kubernetes.protobuf")
            req.selectors()
            if req.verb == "watch":
                return self.watch(req, want, call)
            with LOCK:
                if req.verb == "get":
                    obj = STATE["objects"].get(req.path())
                    if obj is None:
                        raise not_found(req.res, req.name)
                    obj = copy.deepcopy(obj)
                    if req.sub == "scale":
                        return self.send_json(200, scale_of(req.res, obj), call=call)
                    body = present(req, want, [obj], obj["metadata"]["resourceVersion"],
                                   single=True)
                else:
                    rv, items, cont, remaining = list_objects(req)
                    body = present(req, want, items, rv, cont=cont, remaining=remaining)
            return self.send_json(200, body, call=call)
        code, body = write(req, raw, ctype)
        self.send_json(code, body, call=call)

    def non_resource(self, method, path, user, call):
        with LOCK:
            call["verb"] = method.lower() if method != "GET" else "get"
            err = injected_failure(method, path, call["verb"])
        if err is not None:
            raise err
        path = path.rstrip("/") or "/"
        if user == "system:anonymous" and path not in PUBLIC_PATHS:
            raise fail(403, "Forbidden", 'forbidden: User "system:anonymous" cannot %s path '
                       '"%s"' % (call["verb"], path), {})
        if method != "GET":
            raise fail(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")
        parts = [p for p in path.split("/") if p]
        body = None
        if path == "/version":
            body = catalog.version_doc()
        elif path in ("/healthz", "/livez", "/readyz"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            with LOCK:
                call["code"] = 200
            return None
        elif path == "/api":
            host = "%s:%d" % self.server.server_address[:2]
            body = {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                    "serverAddress": host}]}
        elif path == "/apis":
            body = catalog.api_group_list()
        elif parts[:1] == ["api"] and len(parts) == 2:
            body = catalog.resource_list("", parts[1])
        elif parts[:1] == ["apis"] and len(parts) == 2:
            versions = [v for g, v in catalog.groups() if g == parts[1]]
            if versions:
                body = dict(catalog.group_doc(parts[1], versions[0]), kind="APIGroup",
                            apiVersion="v1")
        elif parts[:1] == ["apis"] and len(parts) == 3:
            body = catalog.resource_list(parts[1], parts[2])
        if body is None:
            raise ApiError(404, NO_RESOURCE)
        return self.send_json(200, body, call=call)

    # --- Watch ---

    def chunk(self, event):
        data = (json.dumps(event) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(self, req, want, call):
        q = req.query
        try:
            # timeoutSeconds, else the request's `timeout`, else the longest this fake allows.
            timeout = float(q.get("timeoutSeconds") or go_duration(q.get("timeout"))
                            or MAX_WATCH_SECONDS)
        except ValueError:
            raise bad_request("invalid timeoutSeconds or timeout") from None
        timeout = min(max(timeout, 0), MAX_WATCH_SECONDS)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        initial = q.get("sendInitialEvents") == "true"
        rv = q.get("resourceVersion")
        expired = None
        with LOCK:
            epoch = STATE["epoch"]
            if rv not in (None, "", "0") and not initial:
                pos = parse_rv(rv)
                start = []
                if pos < STATE["compacted"]:
                    expired = status(410, "Expired", "too old resource version: %d (%d)"
                                     % (pos, STATE["compacted"]))
            else:
                pos = STATE["rv"]
                start = [copy.deepcopy(o) for p, o in sorted(STATE["objects"].items())
                         if req.in_scope(p, o) and req.matches(o)]
            call["code"] = 200
            wid = str(uuid.uuid4())
            if expired is None:
                STATE["watches"][wid] = {"path": call["path"], "query": q}
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            if expired is not None:
                self.chunk({"type": "ERROR", "object": expired})
            else:
                self.stream(req, want, pos, start, epoch, timeout, bookmarks, initial)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, ValueError):
            self.close_connection = True
        finally:
            with LOCK:
                STATE["watches"].pop(wid, None)

    def stream(self, req, want, pos, start, epoch, timeout, bookmarks, initial):
        first = [True]

        def shape(obj):
            if want.startswith("table:"):
                t = catalog.table([obj], None, req.query.get("includeObject", "Metadata"),
                                  headers=first[0])
                t["apiVersion"] = "meta.k8s.io/" + want.split(":")[1]
                first[0] = False
                return t
            if want == "partial":
                return catalog.partial(obj)
            return obj

        def bookmark(rv, end=False):
            meta = {"resourceVersion": str(rv)}
            if end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            self.chunk({"type": "BOOKMARK", "object": {
                "kind": req.res["kind"], "apiVersion": catalog.api_version(req.res),
                "metadata": meta}})

        for obj in start:
            self.chunk({"type": "ADDED", "object": shape(obj)})
        if initial and bookmarks:
            bookmark(pos, end=True)
        deadline = time.monotonic() + timeout
        with LOCK:
            every = max(float(STATE["bookmark_seconds"] or 60), 0.1)
        next_bookmark = time.monotonic() + every
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            with LOCK:
                if STATE["epoch"] != epoch:
                    return
                if STATE["rv"] <= pos:
                    wait = min(deadline - now, 1.0)
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    LOCK.wait(max(wait, 0.01))
                if STATE["epoch"] != epoch:
                    return
                records = [r for r in STATE["history"] if r["rv"] > pos]
                pos = max(pos, STATE["rv"])
            for rec in records:
                event = self.event_for(req, rec)
                if event is not None:
                    self.chunk({"type": event, "object": shape(rec["object"])})
            if bookmarks and time.monotonic() >= next_bookmark:
                bookmark(pos)
                next_bookmark = time.monotonic() + every

    @staticmethod
    def event_for(req, rec):
        """The event a watcher of `req` sees for a change: an object that starts or stops
        matching its selectors is ADDED or DELETED for it."""
        if rec["res"] != (req.res["group"], req.res["plural"]):
            return None
        if not req.in_scope(rec["path"], rec["object"]):
            return None
        now = req.matches(rec["object"]) if rec["type"] != "DELETED" else False
        before = req.matches(rec["prev"]) if rec["type"] != "ADDED" else False
        if rec["type"] == "DELETED":
            return "DELETED" if before else None
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        if before:
            return "DELETED"
        return None


class ControlHandler(Handler):
    def do_GET(self):
        self.control("GET")

    def do_POST(self):
        self.control("POST")

    def do_PUT(self):
        self.control("PUT")

    def do_DELETE(self):
        self.control("DELETE")

    def control(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        raw = self.read_body()
        if raw is None:
            self.close_connection = True
            return self.send_raw(413, {"error": "body too large"})
        try:
            body = json.loads(raw) if raw else None
        except ValueError as e:
            return self.send_raw(400, {"error": str(e)})
        with LOCK:
            code, out = self.control_locked(method, url.path, query, body)
            data = json.dumps(out)
        self.send_raw(code, data)

    def send_raw(self, code, data):
        data = (data if isinstance(data, str) else json.dumps(data)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    @staticmethod
    def control_locked(method, path, query, body):
        if (method, path) == ("GET", "/_fake/state"):
            out = {k: v for k, v in STATE.items() if k not in HIDDEN}
            out["rv"] = str(STATE["rv"])
            out["compacted"] = str(STATE["compacted"])
            out["watches"] = list(STATE["watches"].values())
            return 200, out
        if (method, path) == ("POST", "/_fake/state"):
            if not isinstance(body, dict):
                return 400, {"error": "a JSON object is needed"}
            for k, v in body.items():
                if k not in HIDDEN | {"objects", "rv", "compacted", "calls", "watches"}:
                    STATE[k] = v
            return 200, {}
        if (method, path) == ("PUT", "/_fake/object"):
            return put_object(body)
        if (method, path) == ("DELETE", "/_fake/object"):
            target = query.get("path", "")
            old = STATE["objects"].get(target)
            if old is None:
                return 404, {"error": "no object at %s" % target}
            route = parse_route(target)
            res = catalog.find(route[0], route[1], route[3])
            return 200, commit("DELETED", target, old, old, res)
        if (method, path) == ("POST", "/_fake/compact"):
            upto = int(query.get("rv", STATE["rv"]))
            STATE["compacted"] = max(STATE["compacted"], min(upto, STATE["rv"]))
            STATE["history"] = [r for r in STATE["history"] if r["rv"] > STATE["compacted"]]
            STATE["epoch"] += 1
            LOCK.notify_all()
            return 200, {"compacted": str(STATE["compacted"])}
        if (method, path) == ("DELETE", "/_fake/calls"):
            STATE["calls"] = []
            return 200, {}
        return 404, {"error": "no such control call"}


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError, socket.timeout)):
            return
        super().handle_error(request, client_address)


class TlsServer(Server):
    """Completes each TLS handshake in the connection's own thread, with a timeout."""

    def __init__(self, address, handler, context):
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request, client_address):
        request.settimeout(10)
        try:
            conn = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            try:
                conn.close()
            except OSError:
                pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token", required=True, action="append")
    parser.add_argument("--user")
    args = parser.parse_args()
    STATE["tokens"] = list(args.token)
    if args.user:
        STATE["user"] = args.user
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    api = TlsServer(("127.0.0.1", 0), ApiHandler, context)
    control = Server(("127.0.0.1", 0), ControlHandler)
    for s in (api, control):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready %d %d" % (api.server_address[1], control.server_address[1]), flush=True)
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    main()
