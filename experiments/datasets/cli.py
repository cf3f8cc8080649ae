"""`medstack data list`, `medstack data fetch NAME [--from PATH_OR_URL]`, `medstack data path NAME`."""

from __future__ import annotations

import json
from typing import Optional

import typer


def data_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The registered published data sets: license, size, whether fetched and where (experiments/datasets/datasets.yaml,
    or the YAML file $MEDSTACK_DATA_REGISTRY names; --json adds what reads them)."""
    from experiments.datasets.registry import list_sets

    rows = list_sets()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    # plain aligned lines (no table): full paths stay on one line, for copy-paste and grep
    table = [("NAME", "LICENSE", "SIZE", "FETCHED", "PATH (what --data NAME reads) / HOW TO FETCH")]
    for r in rows:
        table.append((r["name"], r["license"], r["size_h"], "yes" if r["fetched"] else "no",
                      r["where"] if r["fetched"] else r["fetch"]))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])


def data_fetch(
    name: str = typer.Argument(..., help="Registered set (see `medstack data list`)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Copy from here instead of the registry's URLs: a file (one-file sets), "
                                        "a folder holding the files, the .tar.gz or the unpacked folder (published runs), or a URL."),
    force: bool = typer.Option(False, "--force", help="Fetch again even if already fetched."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Download (or copy with --from) a published set into $MEDSTACK_HOME/data/NAME/, verifying every sha256.

    A checksum mismatch or a failed download exits with status 2 and keeps nothing. Prints the set's main
    path (what `--data NAME` resolves to) on stdout and its license on stderr.
    """
    from experiments.datasets.registry import fetch

    typer.echo(str(fetch(name, from_, progress=not no_progress, force=force)))


def data_path(name: str = typer.Argument(..., help="Registered set or a path.")) -> None:
    """Print what `--data NAME` resolves to (exit 2 with the fetch command when the set is not fetched)."""
    from experiments.datasets.registry import resolve_data

    typer.echo(resolve_data(name))


def register(data_app, **_) -> None:
    data_app.command("list")(data_list)
    data_app.command("fetch")(data_fetch)
    data_app.command("path")(data_path)
