#!/usr/bin/env python3
"""Checks the JSON Schema corpus (tests/data/json_schemas/NN_name.json) against the Python
`jsonschema` package: every instance in "valid" (and "valid_not_generated": valid, but outside
what the grammar generates) must validate, every instance in "invalid" must not. Formats are
checked (FormatChecker). OpenAPI's "nullable": true, which JSON Schema ignores, is rewritten
as a union with null first, the way the grammar builder reads it.

  .venv-e2e/bin/python tools/check_schema_corpus.py [corpus_dir]
"""
import copy
import json
import pathlib
import sys

import jsonschema


def rewrite_nullable(node):
    if isinstance(node, list):
        return [rewrite_nullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: rewrite_nullable(v) for k, v in node.items()}
    if out.pop("nullable", False) is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    corpus = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests/data/json_schemas"
    files = sorted(corpus.glob("*.json"))
    failures = []
    counts = {"files": 0, "valid": 0, "invalid": 0}
    for path in files:
        doc = json.loads(path.read_text())
        for key in ("schema", "valid", "invalid"):
            if key not in doc:
                failures.append(f"{path.name}: missing '{key}'")
        schema = rewrite_nullable(copy.deepcopy(doc.get("schema", {})))
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as e:
            failures.append(f"{path.name}: bad schema: {e.message}")
            continue
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        counts["files"] += 1
        for key in ("valid", "valid_not_generated"):
            for inst in doc.get(key, []):
                errors = list(validator.iter_errors(inst))
                counts["valid"] += 1
                if errors:
                    failures.append(f"{path.name}: {key} instance {json.dumps(inst)} fails: "
                                    f"{errors[0].message}")
        for inst in doc.get("invalid", []):
            counts["invalid"] += 1
            if validator.is_valid(inst):
                failures.append(f"{path.name}: invalid instance {json.dumps(inst)} validates")
    for f in failures:
        print("FAIL", f)
    print(f"{counts['files']} schemas, {counts['valid']} valid and {counts['invalid']} invalid "
          f"instances, {len(failures)} failures")
    return 1 if failures or not files else 0


if __name__ == "__main__":
    sys.exit(main())
