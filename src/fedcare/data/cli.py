"""`fedcare data ...`: `summary <layout> PATH` checks a dataset copy, `synth <name> OUT` writes a
synthetic one. The commands are the registered datasets' (`fedcare.data.registry`); this
module only mounts them. The lead mounts `data_app` as `fedcare data`."""

from __future__ import annotations

import sys

import typer

from fedcare.data import registry
from fedcare.plugins import PluginError

data_app = typer.Typer(help="Check dataset copies and generate synthetic cohorts.", no_args_is_help=True)
summary_app = typer.Typer(help="Check a dataset copy on disk and summarize it (counts, labels, problems).",
                          no_args_is_help=True)
synth_app = typer.Typer(help="Generate synthetic datasets in the layout of a real one (no real patients).",
                        no_args_is_help=True)
data_app.add_typer(summary_app, name="summary")
data_app.add_typer(synth_app, name="synth")


def _mount() -> None:
    """Every registered dataset's commands. An outside dataset (an entry point) that is
    declared wrongly or cannot be imported is left out with one line on stderr saying why:
    it never stops fedcare's other commands."""
    try:
        datasets = registry.names()
    except PluginError as e:
        print(f"fedcare: outside datasets left out: {e}", file=sys.stderr)
        datasets = list(registry.BUILT_IN)
    for dataset in datasets:
        try:
            commands = registry.part(dataset, "commands")
        except ImportError as e:
            if dataset in registry.BUILT_IN:
                raise
            print(f"fedcare: dataset {dataset!r} left out: its commands cannot be imported ({e})", file=sys.stderr)
            continue
        for name, command in commands.SUMMARY.items():
            summary_app.command(name)(command)
        for name, command in commands.SYNTH.items():
            synth_app.command(name)(command)


_mount()
