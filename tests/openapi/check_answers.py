"""Checks real answers of a running livegate against its OpenAPI document (tests/it/openapi.rs).

Usage: check_answers.py OPENAPI_JSON ANSWERS_JSON

ANSWERS_JSON is a list of {"method", "path" (the template), "status", "content_type",
"body" (parsed JSON, or null for a body that is not JSON)}. Each answer must have a
documented response for its status (the exact code, else `NXX`, else `default`), with a
media type its Content-Type names; a JSON body must validate (JSON Schema 2020-12) against
that media type's schema, made strict: an object schema that lists properties allows no
others, so a field the server sends and the document does not name is reported too.
Prints every mismatch and exits 1 when there is one.
"""

import copy
import json
import sys

from jsonschema import Draft202012Validator


def strict(node):
    """A copy of a schema where every object schema with properties allows no others."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["unevaluatedProperties"] = False
    return out


def resolve(doc, node):
    """Follows a local `$ref` of an OpenAPI object (not of a schema) to its target."""
    while isinstance(node, dict) and "$ref" in node:
        target = doc
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def documented_response(operation, status):
    responses = operation.get("responses", {})
    for key in (str(status), f"{str(status)[0]}XX", "default"):
        if key in responses:
            return key, responses[key]
    return None, None


def check(doc, answer):
    method, path, status = answer["method"].lower(), answer["path"], answer["status"]
    where = f"{answer['method']} {path} -> {status}"
    item = doc.get("paths", {}).get(path)
    if item is None or method not in item:
        return [f"{where}: the operation is not documented"]
    key, response = documented_response(item[method], status)
    if response is None:
        return [f"{where}: status {status} is not documented (documented: {sorted(item[method].get('responses', {}))})"]
    response = resolve(doc, response)
    content = response.get("content")
    if not content:
        if answer["body"] not in (None, ""):
            return [f"{where}: the answer has a body, response {key} documents none"]
        return []
    media = (answer.get("content_type") or "").split(";")[0].strip().lower()
    if media not in content:
        return [f"{where}: Content-Type {media!r} is not one of the documented {sorted(content)}"]
    schema = content[media].get("schema")
    if media != "application/json" or schema is None:
        return []
    if answer["body"] is None:
        return [f"{where}: documented as JSON, the body is not JSON"]
    root = strict({"$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc.get("components", {})})
    root["allOf"] = [strict(copy.deepcopy(schema))]
    errors = sorted(Draft202012Validator(root).iter_errors(answer["body"]), key=lambda e: list(e.absolute_path))
    return [f"{where}: body {json.dumps(answer['body'])[:300]}: at {list(e.absolute_path)}: {e.message[:300]}" for e in errors]


def main():
    doc_path, answers_path = sys.argv[1], sys.argv[2]
    with open(doc_path) as f:
        doc = json.load(f)
    with open(answers_path) as f:
        answers = json.load(f)
    failures = [failure for answer in answers for failure in check(doc, answer)]
    for failure in failures:
        print(failure)
    print(f"{len(answers)} answers checked, {len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
