"""`fedcare data ...`: `summary <layout> PATH` checks a dataset copy, `synth <name> OUT` writes a
synthetic one. The commands are the registered datasets' (`fedcare.data.registry`); this
module only mounts them. The lead mounts `data_app` as `fedcare data`."""

from __future__ import annotations

import typer

from fedcare.data import registry

data_app = typer.Typer(help="Check dataset copies and generate synthetic cohorts.", no_args_is_help=True)
summary_app = typer.Typer(help="Check a dataset copy on disk and summarize it (counts, labels, problems).",
                          no_args_is_help=True)
synth_app = typer.Typer(help="Generate synthetic datasets in the layout of a real one (no real patients).",
                        no_args_is_help=True)
data_app.add_typer(summary_app, name="summary")
data_app.add_typer(synth_app, name="synth")

for _dataset in registry.names():
    _commands = registry.part(_dataset, "commands")
    for _name, _command in _commands.SUMMARY.items():
        summary_app.command(_name)(_command)
    for _name, _command in _commands.SYNTH.items():
        synth_app.command(_name)(_command)
