"""`dedupe-worker` command line."""

import typer

from dedupe_worker import __version__

app = typer.Typer(help="""Segment-style exactly-once dedupe workers on RocksDB.""", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app(prog_name="dedupe-worker")
