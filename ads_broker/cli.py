"""`ads-broker` command line."""

import typer

from ads_broker import __version__

app = typer.Typer(help="""Kafka-wire-compatible log broker written in Python (the ADS broker core).""", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app(prog_name="ads-broker")
