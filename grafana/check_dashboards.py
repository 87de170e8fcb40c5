"""Round-trips Grafana dashboard JSON through Grafana's typed model (grafana-foundation-sdk).

    python grafana/check_dashboards.py grafana/dashboards/*.json

There is no Grafana to load the dashboards into here, so this is the check that the JSON is
what Grafana's schema describes: every key of the file must survive decoding into the typed
model and encoding back (a key the model does not know is dropped, and reported here), with the
same value; and every panel unit must be one of Grafana's unit ids. Run by
tailrace/tests/stack.rs inside the tool environment that .ci/run installs (target/ci-venv).
"""

import json
import sys
import typing

from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import units
from grafana_foundation_sdk.models.dashboard import Dashboard


def differences(before, after, path):
    """Every place where `before` is not found unchanged in `after`."""
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [f"{path}: became {type(after).__name__}"]
        out = []
        for key, value in before.items():
            if key not in after:
                out.append(f"{path}.{key}: unknown to Grafana's model (dropped)")
            else:
                out += differences(value, after[key], f"{path}.{key}")
        return out
    if isinstance(before, list):
        if not isinstance(after, list) or len(before) != len(after):
            return [f"{path}: list changed"]
        out = []
        for i, (b, a) in enumerate(zip(before, after)):
            out += differences(b, a, f"{path}[{i}]")
        return out
    if before != after:
        return [f"{path}: {before!r} became {after!r}"]
    return []


def unit_ids():
    """Grafana's unit ids, from the SDK's `units` module (typing.Literal constants)."""
    ids = set()
    for value in vars(units).values():
        if isinstance(value, str):
            ids.add(value)
    for hint in typing.get_type_hints(units).values():
        ids.update(a for a in typing.get_args(hint) if isinstance(a, str))
    return ids


def panels(dashboard):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def check(path, known_units):
    with open(path, encoding="utf-8") as f:
        source = json.load(f)
    model = Dashboard.from_json(source)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    problems = differences(source, again, "$")
    for p in panels(source):
        if p.get("type") == "row":
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in known_units:
            problems.append(f"panel {p.get('id')} {p.get('title')!r}: unit {unit!r} is not a Grafana unit id")
    return problems


def main(paths):
    if not paths:
        print("usage: check_dashboards.py DASHBOARD.json...", file=sys.stderr)
        return 2
    plugins.register_default_plugins()
    known_units = unit_ids()
    failed = False
    for path in paths:
        problems = check(path, known_units)
        if problems:
            failed = True
            print(f"{path}:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
        else:
            print(f"{path}: ok (round trip through Grafana's typed model, units known)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
