"""The resource types that tests/kubeapi/fake_apiserver.py serves, and what depends only on them:
discovery documents, label and field selectors, and the Table form of objects.

Written from the Kubernetes API reference (each resource's page: kind, scope, short names,
subresources, the verbs of its operations), "Kubernetes API Concepts" (discovery, Tables),
the "Labels and Selectors" and "Field Selectors" concept pages, and the CRDs that Kubeflow
(Notebook), KServe (InferenceService) and KubeRay (RayCluster) publish.
"""

import datetime
import re

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
NS_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]

# Field selectors every type supports; the rest are per type, as the Field Selectors page lists.
COMMON_FIELDS = ["metadata.name", "metadata.namespace"]


def _r(group, version, plural, singular, kind, namespaced=True, short=(), categories=(),
       subresources=(), crd=False, generation=True, returns_object=False, fields=(),
       verbs=ALL_VERBS):
    return {
        "group": group, "version": version, "plural": plural, "singular": singular,
        "kind": kind, "namespaced": namespaced, "short": list(short),
        "categories": list(categories), "subresources": list(subresources), "crd": crd,
        # metadata.generation is kept (set to 1, bumped when anything but metadata and status
        # changes) by the types that have a spec, as their strategies do.
        "generation": generation,
        # DELETE answers with the object (pods, namespaces, custom resources) or with a
        # Status "Success" (the others), as the real registries do.
        "returns_object": returns_object,
        "fields": COMMON_FIELDS + list(fields),
        "verbs": list(verbs),
    }


RESOURCES = [
    _r("", "v1", "pods", "pod", "Pod", short=["po"], categories=["all"],
       subresources=["status"], generation=False, returns_object=True,
       fields=["spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
               "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
               "status.nominatedNodeName"]),
    _r("", "v1", "namespaces", "namespace", "Namespace", namespaced=False, short=["ns"],
       subresources=["status"], generation=False, returns_object=True,
       fields=["status.phase"], verbs=NS_VERBS),
    _r("", "v1", "nodes", "node", "Node", namespaced=False, short=["no"],
       subresources=["status"], generation=False, returns_object=True,
       fields=["spec.unschedulable"]),
    _r("", "v1", "events", "event", "Event", short=["ev"], generation=False,
       fields=["involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
               "reportingComponent", "source", "type"]),
    _r("apps", "v1", "deployments", "deployment", "Deployment", short=["deploy"],
       categories=["all"], subresources=["scale", "status"]),
    _r("apps", "v1", "statefulsets", "statefulset", "StatefulSet", short=["sts"],
       categories=["all"], subresources=["scale", "status"]),
    _r("apps", "v1", "replicasets", "replicaset", "ReplicaSet", short=["rs"],
       categories=["all"], subresources=["scale", "status"]),
    _r("batch", "v1", "jobs", "job", "Job", categories=["all"], subresources=["status"],
       fields=["status.successful"]),
    _r("batch", "v1", "cronjobs", "cronjob", "CronJob", short=["cj"], categories=["all"],
       subresources=["status"]),
    _r("coordination.k8s.io", "v1", "leases", "lease", "Lease", generation=False),
    _r("events.k8s.io", "v1", "events", "event", "Event", short=["ev"], generation=False,
       fields=["regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
               "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath",
               "reason", "reportingController", "type"]),
    _r("kubeflow.org", "v1", "notebooks", "notebook", "Notebook", subresources=["status"],
       crd=True, returns_object=True),
    _r("serving.kserve.io", "v1beta1", "inferenceservices", "inferenceservice",
       "InferenceService", short=["isvc"], subresources=["status"], crd=True,
       returns_object=True),
    _r("ray.io", "v1", "rayclusters", "raycluster", "RayCluster", categories=["all"],
       subresources=["status"], crd=True, returns_object=True),
]

# The kinds whose spec.replicas the scale subresource shows.
SCALABLE = {"deployments", "statefulsets", "replicasets"}

# The list fields whose strategic merge patch merges by a key (the API reference's
# "patch strategy: merge on key ..."), and the primitive lists merged as sets.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath",
    "volumeDevices": "devicePath", "ports": "containerPort", "imagePullSecrets": "name",
    "ownerReferences": "uid", "conditions": "type", "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey", "resourceClaims": "name",
}
MERGE_SETS = {"finalizers"}


def api_version(res):
    return res["group"] + "/" + res["version"] if res["group"] else res["version"]


def qualified(res):
    """The group-qualified resource name of messages: `deployments.apps`, or `pods`."""
    return res["plural"] + "." + res["group"] if res["group"] else res["plural"]


def find(group, version, plural):
    for res in RESOURCES:
        if (res["group"], res["version"], res["plural"]) == (group, version, plural):
            return res
    return None


def by_kind(api_version_, kind):
    for res in RESOURCES:
        if api_version(res) == api_version_ and res["kind"] == kind:
            return res
    return None


def object_path(res, namespace, name):
    base = "/api/v1" if not res["group"] else "/apis/%s/%s" % (res["group"], res["version"])
    if res["namespaced"]:
        return "%s/namespaces/%s/%s/%s" % (base, namespace, res["plural"], name)
    return "%s/%s/%s" % (base, res["plural"], name)


# --- Discovery --------------------------------------------------------------------------------

def groups():
    """(group, version) pairs, in the order of RESOURCES, without the core group."""
    seen = []
    for res in RESOURCES:
        gv = (res["group"], res["version"])
        if res["group"] and gv not in seen:
            seen.append(gv)
    return seen


def group_doc(group, version):
    gv = {"groupVersion": group + "/" + version, "version": version}
    return {"name": group, "versions": [gv], "preferredVersion": gv}


def api_group_list():
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group_doc(g, v) for g, v in groups()]}


def resource_list(group, version):
    """The APIResourceList of a group version, or None when it is not served."""
    entries = []
    for res in RESOURCES:
        if (res["group"], res["version"]) != (group, version):
            continue
        entry = {"name": res["plural"], "singularName": res["singular"],
                 "namespaced": res["namespaced"], "kind": res["kind"], "verbs": res["verbs"]}
        if res["short"]:
            entry["shortNames"] = res["short"]
        if res["categories"]:
            entry["categories"] = res["categories"]
        entries.append(entry)
        for sub in res["subresources"]:
            sub_entry = {"name": res["plural"] + "/" + sub, "singularName": "",
                         "namespaced": res["namespaced"], "kind": res["kind"],
                         "verbs": SUB_VERBS}
            if sub == "scale":
                sub_entry.update(group="autoscaling", version="v1", kind="Scale")
            entries.append(sub_entry)
    if not entries:
        return None
    gv = group + "/" + version if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": entries}


def version_doc():
    return {"major": "1", "minor": "32", "gitVersion": "v1.32.4",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2025-04-22T16:02:27Z", "goVersion": "go1.23.8", "compiler": "gc",
            "platform": "linux/amd64"}


# --- Label selectors --------------------------------------------------------------------------

class SelectorError(Exception):
    pass


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"


def _split_top(text):
    """Splits at the commas that are not inside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_labels(text):
    """Parses a label selector into requirements (key, op, values); raises SelectorError."""
    reqs = []
    if not text or not text.strip():
        return reqs
    for part in _split_top(text):
        p = part.strip()
        m = re.fullmatch(r"(%s)\s+(in|notin)\s+\(([^)]*)\)" % _KEY, p)
        if m:
            values = [v.strip() for v in m.group(3).split(",")]
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise SelectorError("unable to parse requirement: %s" % p)
            reqs.append((m.group(1), m.group(2), values))
            continue
        m = re.fullmatch(r"!\s*(%s)" % _KEY, p)
        if m:
            reqs.append((m.group(1), "!", []))
            continue
        m = re.fullmatch(r"(%s)\s*(==|!=|=|>|<)\s*(%s)" % (_KEY, _VALUE), p)
        if m:
            op = "=" if m.group(2) == "==" else m.group(2)
            if op in "<>" and not re.fullmatch(r"-?\d+", m.group(3)):
                raise SelectorError("unable to parse requirement: for 'gt', 'lt' operators, "
                                    "the value must be an integer")
            reqs.append((m.group(1), op, [m.group(3)]))
            continue
        if re.fullmatch(_KEY, p):
            reqs.append((p, "exists", []))
            continue
        raise SelectorError("unable to parse requirement: found '%s', expected: "
                            "identifier" % p)
    return reqs


def match_labels(reqs, labels):
    labels = labels or {}
    for key, op, values in reqs:
        has, val = key in labels, labels.get(key)
        ok = {
            "exists": has,
            "!": not has,
            "=": has and val == values[0],
            "!=": not has or val != values[0],
            "in": has and val in values,
            "notin": not has or val not in values,
        }.get(op)
        if ok is None:  # gt, lt
            try:
                n = int(val) if has else None
            except ValueError:
                n = None
            ok = n is not None and (n > int(values[0]) if op == ">" else n < int(values[0]))
        if not ok:
            return False
    return True


def selector_string(selector):
    """A LabelSelector (matchLabels, matchExpressions) in the string form of Scale's
    status.selector."""
    if not selector:
        return ""
    parts = ["%s=%s" % (k, v) for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        op = e.get("operator")
        vals = ",".join(sorted(e.get("values") or []))
        if op == "In":
            parts.append("%s in (%s)" % (e["key"], vals))
        elif op == "NotIn":
            parts.append("%s notin (%s)" % (e["key"], vals))
        elif op == "Exists":
            parts.append(e["key"])
        elif op == "DoesNotExist":
            parts.append("!" + e["key"])
    return ",".join(sorted(parts))


# --- Field selectors --------------------------------------------------------------------------

def parse_fields(text, res):
    """Parses a field selector into (field, op, value) with op "=" or "!="; raises
    SelectorError for a field the type does not support, as the server answers 400."""
    reqs = []
    if not text or not text.strip():
        return reqs
    parts, cur, esc = [], "", False
    for ch in text:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            cur += ch
            esc = True
        elif ch == ",":
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        m = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", p.strip())
        if not m:
            raise SelectorError("invalid selector: '%s'; can't understand '%s'" % (text, p))
        field, op, value = m.group(1), m.group(2), m.group(3)
        value = re.sub(r"\\(.)", r"\1", value)
        if field not in res["fields"]:
            raise SelectorError('field label not supported: %s' % field)
        reqs.append((field, "!=" if op == "!=" else "=", value))
    return reqs


def field_value(obj, field):
    cur = obj
    for part in field.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, dict) and field == "source":
        return cur.get("component", "")
    return str(cur)


def match_fields(reqs, obj):
    for field, op, value in reqs:
        have = field_value(obj, field)
        if (have == value) != (op == "="):
            return False
    return True


# --- Tables -----------------------------------------------------------------------------------

NAME_DESCRIPTION = ("Name must be unique within a namespace. Is required when creating "
                    "resources, although some resources may allow a client to request the "
                    "generation of an appropriate name automatically. Name is primarily "
                    "intended for creation idempotence and configuration definition. Cannot "
                    "be updated. More info: https://kubernetes.io/docs/concepts/overview/"
                    "working-with-objects/names#names")
CREATED_DESCRIPTION = ("CreationTimestamp is a timestamp representing the server time when "
                       "this object was created. It is not guaranteed to be set in "
                       "happens-before order across separate operations. Clients may not set "
                       "this value. It is represented in RFC3339 form and is in UTC.\n\n"
                       "Populated by the system. Read-only. Null for lists. More info: "
                       "https://git.k8s.io/community/contributors/devel/sig-architecture/"
                       "api-conventions.md#metadata")


def partial(obj):
    """An object's PartialObjectMetadata."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {})}


def table(objs, rv, include, headers=True):
    """The default Table the API concepts page describes (Name, Created At), for every type:
    the real server has richer columns for built-in types, which this fake does not."""
    rows = []
    for obj in objs:
        meta = obj.get("metadata", {})
        row = {"cells": [meta.get("name", ""), meta.get("creationTimestamp")]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = partial(obj)
        rows.append(row)
    t = {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
         "metadata": {"resourceVersion": rv} if rv else {}, "rows": rows}
    if headers:
        t["columnDefinitions"] = [
            {"name": "Name", "type": "string", "format": "name",
             "description": NAME_DESCRIPTION, "priority": 0},
            {"name": "Created At", "type": "date", "format": "",
             "description": CREATED_DESCRIPTION, "priority": 0},
        ]
    else:
        t["columnDefinitions"] = None
    return t


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
