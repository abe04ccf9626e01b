"""`star world …` (build, import, synth) and `star tool` (call one sandbox tool from the shell)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from components.errors import UserError

# Each handler imports its stage code (typed params, MLflow through components.tracking) when called, so that
# `star --help` stays instant.


def register(subparsers: argparse._SubParsersAction) -> None:
    world = subparsers.add_parser("world", help="materialise the sandbox database (synthetic or real)")
    world_sub = world.add_subparsers(dest="world_command", metavar="ACTION", required=True)

    build = world_sub.add_parser("build", help="the `world` stage: synthesise or import, as params/world.yaml says")
    build.add_argument("--params", default="params/world.yaml", help="params file with a `world:` section")
    build.add_argument("--out", default="data/world", help="output world directory")
    build.set_defaults(handler=build_handler)

    synth = world_sub.add_parser("synth", help="generate a synthetic world from params")
    synth.add_argument("--params", default="params/world.yaml", help="params file with a `world:` section")
    synth.add_argument("--out", required=True, help="output world directory")
    synth.set_defaults(handler=synth_handler)

    imp = world_sub.add_parser("import", help="import the real TravelPlanner database")
    imp.add_argument("--source", required=True, help="folder holding database/ (official or flat layout)")
    imp.add_argument("--out", required=True, help="output world directory")
    imp.add_argument("--flights-from-ref-info", default=None, metavar="FILE",
                     help="build flights from the flight rows of a train_ref_info.jsonl (when the CSV is absent)")
    imp.set_defaults(handler=import_handler)

    tool = subparsers.add_parser("tool", help="call one sandbox tool, e.g. star tool --world data/world "
                                              "SearchCity '{\"state\": \"Texas\"}'")
    tool.add_argument("--world", default="data/world", help="world directory")
    tool.add_argument("name", help="tool name (SearchFlight, GoogleDistanceMatrix, SearchAccommodation, "
                                   "SearchRestaurant, SearchAttraction, SearchCity)")
    tool.add_argument("arguments", help="JSON object of arguments")
    tool.set_defaults(handler=tool_handler)


def _load_world_params(path: str):
    from components.params import load_section
    from components.travel.synthetic import WorldParams

    return load_section(path, "world", WorldParams)


def _report(manifest: dict, out: str) -> None:
    rows = ", ".join(f"{name} {info['rows']:,}" for name, info in manifest["tables"].items())
    print(f"wrote {out}: {rows}; prompt style {manifest.get('prompt_style', 'full')}")


def build_world(params, out: str) -> dict:
    """What the `world` stage does: synthesise when `source` is "synthetic", else import from that path."""
    if params.source == "synthetic":
        from components.travel.synthetic import write_synthetic_world

        return write_synthetic_world(params, out)
    from components.travel.importer import import_database

    if not Path(params.source).exists():
        raise UserError(f"world.source={params.source!r} is neither \"synthetic\" nor an existing database folder")
    return import_database(params.source, out, flights_from_ref_info=params.flights_from_ref_info,
                           prompt_style=params.prompt_style)


def build_handler(args: argparse.Namespace) -> int:
    from components import tracking  # MLflow only; the sandbox itself imports no ML library

    params = _load_world_params(args.params)
    with tracking.stage_run("world", params=params) as run:
        manifest = build_world(params, args.out)
        run.log_stats({f"rows.{name}": info["rows"] for name, info in manifest["tables"].items()})
        run.log_artifact(str(Path(args.out) / "manifest.json"))
    _report(manifest, args.out)
    return 0


def synth_handler(args: argparse.Namespace) -> int:
    from components.travel.synthetic import write_synthetic_world

    _report(write_synthetic_world(_load_world_params(args.params), args.out), args.out)
    return 0


def import_handler(args: argparse.Namespace) -> int:
    from components.travel.importer import import_database

    _report(import_database(args.source, args.out, flights_from_ref_info=args.flights_from_ref_info), args.out)
    return 0


def tool_handler(args: argparse.Namespace) -> int:
    from components.travel.tools import call_tool
    from components.travel.world import World

    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        raise UserError(f"arguments must be a JSON object, e.g. '{{\"city\": \"Dallas\"}}' ({exc.msg})") from None
    output = call_tool(World.load(args.world), args.name, arguments)
    print(output.text)
    return 0 if output.ok else 1
