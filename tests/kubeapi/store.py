"""The objects of tests/kubeapi/fake_apiserver.py and what is done to them, written from
"Kubernetes API Concepts" (resourceVersion, list semantics with resourceVersionMatch, limit and
continue, the 410 Expired answers), the API reference of ObjectMeta, ListMeta and Status (the
fields the server owns, the errors and their wording), and each resource's reference (the scale
and status subresources; what create, update, patch and delete answer).

One global resourceVersion counter is bumped on every write, and every change is kept in a
history (until compacted) for watches and for lists at an exact resourceVersion. A write that
changes nothing writes nothing.
"""

import base64
import copy
import json
import random
import re
import threading
import uuid

import catalog
import patches
from catalog import qualified

MAX_BODY = 3 * 1024 * 1024
MAX_WATCH_SECONDS = 600
MAX_HISTORY = 20000

# Guards STATE; notified on every write and compaction, which wakes the watches.
LOCK = threading.Condition()
STATE = {
    "objects": {},
    "rv": 1000,
    "compacted": 0,
    "epoch": 0,
    "history": [],
    "calls": [],
    "watches": {},
    "tokens": [],
    "user": "system:serviceaccount:gpuwatch:gpuwatch-controller",
    "anonymous": True,
    "denied": [],
    "conflicts": [],
    "fail": [],
    "latency_ms": 0,
    "mirror_replicas": True,
    "bookmark_seconds": 60,
    "require_namespaces": False,
}
HIDDEN = {"history", "epoch"}


class ApiError(Exception):
    def __init__(self, code, body, headers=None):
        super().__init__(body.get("message", ""))
        self.code, self.body, self.headers = code, body, headers or {}


def status(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details is not None:
        s["details"] = {k: v for k, v in details.items() if v not in ("", None)}
    return s


def fail(code, reason, message, details=None, headers=None):
    return ApiError(code, status(code, reason, message, details), headers)


def details(res, name):
    return {"name": name, "group": res["group"], "kind": res["plural"]}


def not_found(res, name):
    return fail(404, "NotFound", '%s "%s" not found' % (qualified(res), name), details(res, name))


def conflict(res, name, why="the object has been modified; please apply your changes to the "
                            "latest version and try again"):
    return fail(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s'
                % (qualified(res), name, why), details(res, name))


def invalid(kind, group, name, field, detail, cause_reason, value=None):
    """An Invalid (422) Status, as `Kind.group "name" is invalid: field: detail`."""
    qkind = kind + "." + group if group else kind
    msg = ("Invalid value: %s: %s" % (json.dumps(value), detail)
           if cause_reason == "FieldValueInvalid" else detail)
    return fail(422, "Invalid", '%s "%s" is invalid: %s: %s' % (qkind, name, field, msg),
                {"name": name, "group": group, "kind": kind,
                 "causes": [{"reason": cause_reason, "message": msg, "field": field}]})


def bad_request(message):
    return fail(400, "BadRequest", message)


NO_RESOURCE = status(404, "NotFound", "the server could not find the requested resource", {})


# --- The store --------------------------------------------------------------------------------

def commit(kind, path, obj, prev, res):
    """Writes (or, for DELETED, removes) an object at the next resourceVersion and records the
    change for watches. With LOCK held."""
    STATE["rv"] += 1
    rv = STATE["rv"]
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = str(rv)
    if kind == "DELETED":
        STATE["objects"].pop(path, None)
    else:
        STATE["objects"][path] = obj
    history = STATE["history"]
    history.append({"rv": rv, "type": kind, "path": path, "res": (res["group"], res["plural"]),
                    "object": obj, "prev": copy.deepcopy(prev)})
    if len(history) > MAX_HISTORY:
        dropped = history[: len(history) - MAX_HISTORY]
        del history[: len(dropped)]
        STATE["compacted"] = dropped[-1]["rv"]
    LOCK.notify_all()
    return copy.deepcopy(obj)


def snapshot(rv):
    """The objects as they were at resourceVersion rv (not older than the compaction)."""
    objects = dict(STATE["objects"])
    for rec in reversed(STATE["history"]):
        if rec["rv"] <= rv:
            break
        if rec["type"] == "ADDED":
            objects.pop(rec["path"], None)
        else:
            objects[rec["path"]] = rec["prev"]
    return objects


def spec_part(obj):
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind",
                                                        "apiVersion")}


def finish_meta(res, obj, old):
    """Sets what the server owns: kind, apiVersion, uid, creationTimestamp, generation; the
    defaults of namespaces. `old` is the stored object or None."""
    obj["kind"], obj["apiVersion"] = res["kind"], catalog.api_version(res)
    meta = obj.setdefault("metadata", {})
    if old is not None:
        for key in ("uid", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        if res["generation"]:
            gen = old["metadata"].get("generation", 1)
            meta["generation"] = gen + 1 if spec_part(obj) != spec_part(old) else gen
    else:
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = catalog.now()
        if res["generation"]:
            meta["generation"] = 1
    if res["plural"] == "namespaces":
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")


def mirror_replicas(res, obj, old):
    """The one controller-like hook: status.replicas follows a changed spec.replicas."""
    if not STATE["mirror_replicas"] or res["plural"] not in catalog.SCALABLE:
        return
    want = (obj.get("spec") or {}).get("replicas")
    had = None if old is None else (old.get("spec") or {}).get("replicas")
    if want is not None and want != had:
        obj.setdefault("status", {})["replicas"] = want


def check_replicas(res, obj, name):
    if res["plural"] not in catalog.SCALABLE and obj.get("kind") != "Scale":
        return
    replicas = (obj.get("spec") or {}).get("replicas")
    if replicas is None:
        return
    kind, group = ("Scale", "autoscaling") if obj.get("kind") == "Scale" else (res["kind"],
                                                                                res["group"])
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise bad_request("%s in version \"%s\" cannot be handled as a %s: json: cannot "
                          "unmarshal %s into Go struct field spec.replicas of type int32"
                          % (kind, "v1", kind, type(replicas).__name__))
    if replicas < 0:
        raise invalid(kind, group, name, "spec.replicas", "must be greater than or equal to 0",
                      "FieldValueInvalid", replicas)


# --- Reads ------------------------------------------------------------------------------------

def strip_type(res, obj):
    """A list item: typed lists of built-in types carry no kind and apiVersion per item;
    custom resources keep theirs."""
    if res["crd"]:
        return obj
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def encode_continue(rv, start):
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token):
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid: incorrect encoded start "
                          "resourceVersion (version meta.k8s.io/v1)") from None


def go_duration(text):
    """Seconds of a Go duration such as "20s", "1m30s" or "500ms"; 0 for none."""
    if not text:
        return 0
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    found = re.findall(r"([0-9.]+)(h|ms|us|µs|ns|m|s)", text)
    if not found or "".join(n + u for n, u in found) != text:
        raise ValueError(text)
    return sum(float(n) * units[u] for n, u in found)


def parse_rv(text):
    try:
        n = int(text)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise bad_request('invalid resource version: strconv.ParseUint: parsing "%s": invalid '
                          'syntax' % text) from None


def list_objects(req):
    """(resourceVersion, items, continue, remaining) of a list request. With LOCK held."""
    q = req.query
    current = STATE["rv"]
    token, rv, match = q.get("continue"), q.get("resourceVersion"), q.get("resourceVersionMatch")
    start = ""
    if token:
        list_rv, start = decode_continue(token)
        if list_rv < STATE["compacted"]:
            body = status(410, "Expired",
                          "The provided continue parameter is too old to display a consistent "
                          "list result. You can start a new list without the continue "
                          "parameter, or use the continue token in this response to retrieve "
                          "the remainder of the results. Continuing with the provided token "
                          "results in an inconsistent list - objects that were created, "
                          "modified, or deleted between the time the first chunk was returned "
                          "and now may show up in the list.")
            body["metadata"]["continue"] = encode_continue(current, start)
            raise ApiError(410, body)
        objects = snapshot(list_rv)
    elif match == "Exact":
        if not rv:
            raise bad_request("resourceVersionMatch is forbidden unless resourceVersion is "
                              "provided")
        list_rv = parse_rv(rv)
        if list_rv < STATE["compacted"]:
            raise fail(410, "Expired", "too old resource version: %d (%d)"
                       % (list_rv, STATE["compacted"]))
        if list_rv > current:
            raise too_large(list_rv, current)
        objects = snapshot(list_rv)
    else:
        if rv not in (None, "", "0"):
            n = parse_rv(rv)
            if n > current:
                raise too_large(n, current)
        list_rv, objects = current, STATE["objects"]
    items = []
    for path in sorted(objects):
        obj = objects[path]
        if req.in_scope(path, obj) and req.matches(obj) and path > start:
            items.append((path, obj))
    limit = q.get("limit")
    cont, remaining = "", None
    if limit and limit.isdigit() and int(limit) > 0 and len(items) > int(limit):
        rest = len(items) - int(limit)
        items = items[: int(limit)]
        cont = encode_continue(list_rv, items[-1][0])
        if not q.get("labelSelector") and not q.get("fieldSelector"):
            remaining = rest
    return str(list_rv), [copy.deepcopy(o) for _, o in items], cont, remaining


def too_large(n, current):
    body = status(504, "Timeout", "Too large resource version: %d, current: %d" % (n, current),
                  {"causes": [{"reason": "ResourceVersionTooLarge",
                               "message": "Too large resource version"}],
                   "retryAfterSeconds": 1})
    return ApiError(504, body, {"Retry-After": "1"})


def present(req, want, objs, rv, single=False, cont="", remaining=None):
    """A get or list answer in the form the Accept header asked for."""
    if want.startswith("table:"):
        t = catalog.table(objs, rv, req.query.get("includeObject", "Metadata"))
        t["apiVersion"] = "meta.k8s.io/" + want.split(":")[1]
        if cont:
            t["metadata"]["continue"] = cont
        return t
    if want == "partial":
        if single:
            return catalog.partial(objs[0])
        meta = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        return {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": meta, "items": [catalog.partial(o) for o in objs]}
    if single:
        return objs[0]
    meta = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return {"kind": req.res["kind"] + "List", "apiVersion": catalog.api_version(req.res),
            "metadata": meta, "items": [strip_type(req.res, o) for o in objs]}


def scale_of(res, obj):
    meta = obj["metadata"]
    selector = ((obj.get("spec") or {}).get("selector"))
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": catalog.selector_string(selector)}}


# --- Writes -----------------------------------------------------------------------------------

def parse_body(raw, ctype):
    base = (ctype or "").split(";")[0].strip().lower()
    if base not in ("application/json", ""):
        raise fail(415, "UnsupportedMediaType",
                   "the body of the request was in an unknown format - accepted media types "
                   "include: application/json, application/yaml, "
                   "application/vnd.kubernetes.protobuf, application/cbor")
    try:
        body = json.loads(raw or b"null")
    except ValueError as e:
        raise bad_request("the object provided is unrecognized: %s" % e) from None
    if not isinstance(body, dict):
        raise bad_request("the object provided is unrecognized (must be a JSON object)")
    return body


def check_type(req, body, kind=None, api_version=None):
    kind = kind or req.res["kind"]
    api_version = api_version or catalog.api_version(req.res)
    if body.get("apiVersion") not in (None, "", api_version):
        raise bad_request("the API version in the data (%s) does not match the expected API "
                          "version (%s)" % (body["apiVersion"], api_version))
    if body.get("kind") not in (None, "", kind):
        raise bad_request("%s in version \"%s\" cannot be handled as a %s: no kind \"%s\" is "
                          "registered for version \"%s\"" % (
                              body["kind"], api_version.split("/")[-1], kind, body["kind"],
                              api_version))
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    if req.res["namespaced"] and meta.get("namespace") not in (None, "", req.ns):
        raise bad_request("the namespace of the provided object does not match the namespace "
                          "sent on the request")
    if req.res["namespaced"]:
        meta["namespace"] = req.ns
    if req.name and meta.get("name") not in (None, "", req.name):
        raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                          % (meta["name"], req.name))


def take_conflict(req, path):
    """A concurrent writer, when the test asked for one: bumps the stored object's
    resourceVersion. Returns True when the write must fail whatever it carries."""
    for entry in list(STATE["conflicts"]):
        target = entry.get("path") if isinstance(entry, dict) else entry
        if target != path:
            continue
        STATE["conflicts"].remove(entry)
        old = STATE["objects"].get(path)
        if old is not None:
            commit("MODIFIED", path, old, old, req.res)
        return isinstance(entry, dict) and bool(entry.get("force"))
    return False


def store_update(req, path, new, old, dry_run):
    """Finishes an update of `old` to `new` (already carrying the caller's changes) and writes
    it unless nothing changed. With LOCK held."""
    finish_meta(req.res, new, old)
    check_replicas(req.res, new, req.name)
    mirror_replicas(req.res, new, old)
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
    meta = new["metadata"]
    if meta.get("deletionTimestamp") and not meta.get("finalizers"):
        return commit("DELETED", path, new, old, req.res) if not dry_run else new
    if new == old or dry_run:
        return copy.deepcopy(new)
    return commit("MODIFIED", path, new, old, req.res)


def precondition(req, result_rv, current_rv):
    if result_rv not in (None, "") and result_rv != current_rv:
        raise conflict(req.res, req.name)


def apply_patch(req, target, raw, ctype):
    base = (ctype or "").split(";")[0].strip().lower()
    try:
        patch = json.loads(raw or b"null")
    except ValueError as e:
        raise bad_request("error decoding patch: %s" % e) from None
    try:
        if base == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise patches.BadPatch("a merge patch must be a JSON object")
            return patches.merge_patch(target, patch)
        if base == "application/strategic-merge-patch+json" and not req.res["crd"]:
            return patches.strategic_merge_patch(target, patch)
        if base == "application/json-patch+json":
            return patches.json_patch(target, patch)
        if base == "application/apply-patch+yaml":
            if not req.query.get("fieldManager"):
                raise bad_request("PATCH request must include fieldManager")
            if not isinstance(patch, dict):
                raise patches.BadPatch("an apply patch must be a JSON object")
            if req.res["crd"]:
                return patches.merge_patch(target, patch)
            return patches.strategic_merge_patch(target, patch)
    except patches.BadPatch as e:
        raise bad_request(str(e)) from None
    except patches.PatchError as e:
        # As kubectl shows it: "The request is invalid: the server rejected our request due
        # to an error in our request", with no details.
        raise ApiError(422, status(422, "Invalid", "the server rejected our request due to an "
                                   "error in our request")) from e
    raise fail(415, "UnsupportedMediaType",
               "the body of the request was in an unknown format - accepted media types "
               "include: application/json-patch+json, application/merge-patch+json, "
               "application/apply-patch+yaml" + ("" if req.res["crd"] else
                                                 ", application/strategic-merge-patch+json"))


def write(req, raw, ctype):
    """create, update, patch, delete and deletecollection. Returns (code, body)."""
    dry_run = req.query.get("dryRun") == "All"
    res = req.res
    if req.verb == "create":
        return create(req, parse_body(raw, ctype), dry_run)
    if req.verb == "deletecollection":
        req.selectors()
        with LOCK:
            _, objs, _, _ = list_objects(req)
            for obj in objs:
                m = obj["metadata"]
                if not dry_run:
                    path = catalog.object_path(res, m.get("namespace"), m["name"])
                    commit("DELETED", path, STATE["objects"][path], STATE["objects"][path], res)
        return 200, present(req, "json", objs, str(STATE["rv"]))
    path = req.path()
    body = None
    if req.verb == "update":
        # The name and namespace are checked before the object is looked up.
        body = parse_body(raw, ctype)
        if req.sub == "scale":
            check_type(req, body, "Scale", "autoscaling/v1")
        else:
            check_type(req, body)
    with LOCK:
        forced = take_conflict(req, path)
        old = STATE["objects"].get(path)
        if old is None and req.verb == "patch" and not req.sub and is_apply(ctype):
            body = apply_patch(req, {}, raw, ctype)
            body.setdefault("metadata", {})["name"] = req.name
            return create(req, body, dry_run)
        if old is None:
            raise not_found(res, req.name)
        if forced:
            raise conflict(res, req.name)
        current_rv = old["metadata"]["resourceVersion"]
        if req.verb == "delete":
            return delete(req, path, old, raw, dry_run)
        if req.sub == "scale":
            return 200, write_scale(req, path, old, body, raw, ctype, dry_run)
        if req.verb == "update":
            precondition(req, body["metadata"].get("resourceVersion"), current_rv)
            new = body
        else:
            new = apply_patch(req, copy.deepcopy(old), raw, ctype)
            if not isinstance(new, dict):
                raise bad_request("the patch did not give an object")
            precondition(req, (new.get("metadata") or {}).get("resourceVersion"), current_rv)
            check_type(req, new)
        if "status" in res["subresources"]:
            if req.sub == "status":
                status_ = new.get("status")
                new = copy.deepcopy(old)
                if status_ is None:
                    new.pop("status", None)
                else:
                    new["status"] = status_
            else:
                new["status"] = copy.deepcopy(old.get("status"))
                if new["status"] is None:
                    del new["status"]
        return 200, store_update(req, path, new, old, dry_run)


def is_apply(ctype):
    return (ctype or "").split(";")[0].strip().lower() == "application/apply-patch+yaml"


def create(req, body, dry_run):
    """POST, and an apply patch of an object that does not exist."""
    res = req.res
    check_type(req, body)
    meta = body["metadata"]
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + "".join(
            random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    if not meta.get("name"):
        raise invalid(res["kind"], res["group"], "", "metadata.name",
                      "Required value: name or generateName is required",
                      "FieldValueRequired")
    if meta.get("resourceVersion"):
        raise fail(500, "InternalError", "Internal error occurred: resourceVersion should "
                   "not be set on objects to be created")
    path = req.path(meta["name"])
    with LOCK:
        if res["namespaced"] and STATE["require_namespaces"] and \
                catalog.object_path(catalog.find("", "v1", "namespaces"), None,
                                    req.ns) not in STATE["objects"]:
            raise fail(404, "NotFound", 'namespaces "%s" not found' % req.ns,
                       {"name": req.ns, "kind": "namespaces"})
        if path in STATE["objects"]:
            raise fail(409, "AlreadyExists", '%s "%s" already exists'
                       % (qualified(res), meta["name"]), details(res, meta["name"]))
        finish_meta(res, body, None)
        if "status" in res["subresources"] and res["plural"] not in ("namespaces", "nodes"):
            body.pop("status", None)
            if res["plural"] == "pods":
                body["status"] = {"phase": "Pending"}
        if res["plural"] in catalog.SCALABLE:
            body.setdefault("spec", {}).setdefault("replicas", 1)  # the API's default
        check_replicas(res, body, meta["name"])
        mirror_replicas(res, body, None)
        out = body if dry_run else commit("ADDED", path, body, None, res)
    return 201, out


def delete(req, path, old, raw, dry_run):
    """DELETE of one object: preconditions, finalizers. With LOCK held."""
    try:
        opts = json.loads(raw) if raw and raw.strip() else {}
    except ValueError as e:
        raise bad_request("the DeleteOptions are not JSON: %s" % e) from None
    pre = (opts if isinstance(opts, dict) else {}).get("preconditions") or {}
    meta = old["metadata"]
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise conflict(req.res, req.name, "Precondition failed: UID in precondition: %s, UID "
                       "in object meta: %s" % (pre["uid"], meta.get("uid")))
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
        raise conflict(req.res, req.name, "Precondition failed: ResourceVersion in "
                       "precondition: %s, ResourceVersion in object meta: %s"
                       % (pre["resourceVersion"], meta["resourceVersion"]))
    if meta.get("finalizers"):
        if meta.get("deletionTimestamp"):
            return 200, copy.deepcopy(old)
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = catalog.now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        if req.res["generation"]:
            new["metadata"]["generation"] = meta.get("generation", 1) + 1
        return 200, (new if dry_run else commit("MODIFIED", path, new, old, req.res))
    gone = old if dry_run else commit("DELETED", path, old, old, req.res)
    if req.res["returns_object"]:
        return 200, gone
    return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                 "details": {k: v for k, v in (("name", req.name), ("group", req.group),
                                                ("kind", req.plural), ("uid", meta["uid"])) if v}}


def write_scale(req, path, old, body, raw, ctype, dry_run):
    """PUT (`body`) or PATCH of the scale subresource: only the parent's spec.replicas
    changes."""
    current = scale_of(req.res, old)
    if req.verb == "update":
        new = body
    else:
        new = apply_patch(req, copy.deepcopy(current), raw, ctype)
        if not isinstance(new, dict):
            raise bad_request("the patch did not give an object")
    precondition(req, (new.get("metadata") or {}).get("resourceVersion"),
                 old["metadata"]["resourceVersion"])
    new["kind"] = "Scale"
    check_replicas(req.res, new, req.name)
    parent = copy.deepcopy(old)
    replicas = (new.get("spec") or {}).get("replicas", 0)
    parent.setdefault("spec", {})["replicas"] = replicas
    stored = store_update(req, path, parent, old, dry_run)
    return scale_of(req.res, stored)


def put_object(obj):
    """PUT /_fake/object: an object written as another client would (with LOCK held)."""
    if not isinstance(obj, dict):
        return 400, {"error": "a JSON object is needed"}
    res = catalog.by_kind(obj.get("apiVersion"), obj.get("kind"))
    meta = obj.get("metadata") or {}
    if res is None or not meta.get("name") or (res["namespaced"] and not meta.get("namespace")):
        return 400, {"error": "an object of a served kind with metadata.name (and namespace) "
                              "is needed"}
    path = catalog.object_path(res, meta.get("namespace"), meta["name"])
    old = STATE["objects"].get(path)
    obj = copy.deepcopy(obj)
    given = dict(obj["metadata"])
    finish_meta(res, obj, old)
    for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
        if k in given:
            obj["metadata"][k] = given[k]
    return 200, commit("MODIFIED" if old else "ADDED", path, obj, old, res)
