"""The three patch types of the Kubernetes API, for tests/kubeapi/fake_apiserver.py, written from
their documents: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge patch
as "Update API Objects in Place Using kubectl patch" and the API reference's patch strategies
describe it (maps merge as in a merge patch; the lists that declare a merge key merge their items
by it, `$patch: delete` removes one, `$patch: replace` replaces a map or a list, primitive
lists with the merge strategy are merged as sets with `$deleteFromPrimitiveList/<field>`;
other lists are replaced). `$setElementOrder/<field>` is accepted and not used for ordering.
"""

import copy

from catalog import MERGE_KEYS, MERGE_SETS


class PatchError(Exception):
    """A patch that does not apply to the object (the server answers 422)."""


class BadPatch(Exception):
    """A patch document that is not one (the server answers 400)."""


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_DELETE = object()


def strategic_merge_patch(target, patch):
    if not isinstance(patch, dict):
        raise BadPatch("a strategic merge patch must be a JSON object")
    out = _strategic(target, patch)
    return {} if out is _DELETE else out


def _strategic(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip(patch)
    if directive == "delete":
        return _DELETE
    if directive is not None:
        raise BadPatch("unknown patch type: %s in map: %s" % (directive, patch))
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [x for x in result[field] if x not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        elif isinstance(value, dict):
            merged = _strategic(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = value
    keep = patch.get("$retainKeys")
    if isinstance(keep, list):
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _strip(value):
    """A patch value with its directives and nulls taken out, as a new value."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


def _merge_list(field, current, patch):
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return _strip(patch)
    if field in MERGE_SETS and all(not isinstance(x, (dict, list)) for x in patch):
        out = list(current) if isinstance(current, list) else []
        out.extend(x for x in patch if x not in out)
        return out
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(x, dict) for x in patch):
        return _strip(patch)
    out = copy.deepcopy(current) if isinstance(current, list) else []
    for item in patch:
        at = next((i for i, old in enumerate(out)
                   if isinstance(old, dict) and old.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del out[at]
            continue
        if at is None:
            out.append(_strip(item))
        else:
            out[at] = _strategic(out[at], item)
    return out


# --- JSON patch -------------------------------------------------------------------------------

def _pointer(ptr):
    if not isinstance(ptr, str):
        raise BadPatch("path must be a string: %r" % (ptr,))
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError('invalid JSON pointer "%s"' % ptr)
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr[1:].split("/")]


def _index(container, token, ptr, append=False):
    if append and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise PatchError("invalid array index %s in %s" % (token, ptr))
    i = int(token)
    limit = len(container) if append else len(container) - 1
    if i > limit:
        raise PatchError("index out of bounds: %s in %s" % (token, ptr))
    return i


def _get(doc, parts, ptr):
    cur = doc
    for token in parts:
        if isinstance(cur, dict) and token in cur:
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, ptr)]
        else:
            raise PatchError("doc is missing path: %s: missing value" % ptr)
    return cur


def _same(a, b):
    """JSON equality: 1 and 1.0 are equal, true and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _add(doc, parts, value, ptr):
    if not parts:
        return value
    parent = _get(doc, parts[:-1], ptr)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, ptr, append=True), value)
    else:
        raise PatchError("add operation does not apply: doc is missing path: %s: missing value"
                         % ptr)
    return doc


def _remove(doc, parts, ptr, op="remove"):
    if not parts:
        raise PatchError("%s operation does not apply: cannot remove the whole document" % op)
    parent = _get(doc, parts[:-1], ptr)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, ptr))
    raise PatchError("Unable to remove nonexistent key: %s: missing value" % last)


def json_patch(doc, ops):
    if not isinstance(ops, list):
        raise BadPatch("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise BadPatch("invalid JSON patch operation: %r" % (op,))
        kind, ptr = op["op"], op.get("path")
        parts = _pointer(ptr)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError("%s operation, missing value field" % kind)
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), ptr)
        elif kind == "remove":
            _remove(doc, parts, ptr)
        elif kind == "replace":
            try:
                _get(doc, parts, ptr)
            except PatchError:
                raise PatchError("replace operation does not apply: doc is missing key: %s: "
                                 "missing value" % ptr) from None
            if parts:
                _remove(doc, parts, ptr, "replace")
            doc = _add(doc, parts, copy.deepcopy(op["value"]), ptr)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = copy.deepcopy(_get(doc, source, op.get("from")))
            if kind == "move":
                if parts[:len(source)] == source and parts != source:
                    raise PatchError("move operation: from %s is a prefix of %s"
                                     % (op.get("from"), ptr))
                _remove(doc, source, op.get("from"), "move")
            doc = _add(doc, parts, value, ptr)
        elif kind == "test":
            try:
                have = _get(doc, parts, ptr)
            except PatchError:
                raise PatchError("testing value %s failed: test failed" % ptr) from None
            if not _same(have, op["value"]):
                raise PatchError("testing value %s failed: test failed" % ptr)
        else:
            raise BadPatch("Unexpected kind: %s" % kind)
    return doc
