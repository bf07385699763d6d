"""`spark-audit` command line."""

import typer

from spark_audit import __version__

app = typer.Typer(help="""Nightly duplicate audit of the input and output topics on PySpark.""", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app(prog_name="spark-audit")
