"""`ebs-ops` command line."""

import typer

from ebs_ops import __version__

app = typer.Typer(help="""Consistent snapshots, restore and move of dedupe worker volumes.""", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app(prog_name="ebs-ops")
