"""`medstack review RUN_DIR --judge STEP --sample N`: clinicians label a blind sample of a judge's decisions (docs/protocols.md, Judge calibration)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Optional

import typer


def _default_reviewer() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "reviewer"
    return name if name and name[0].isalnum() else "reviewer"


def review(
    run_dir: Path = typer.Argument(..., help="A results directory of any kind whose study declares judges (a study run, a judge calibration)."),
    judge: str = typer.Option(..., "--judge", help="The judge step to review, as the run's study declares it (e.g. frq, llm-exact, rubric; "
                                                   "a wrong step lists the run's steps). STEP@JUDGE reviews the grades a rescore added "
                                                   "(frq@mistral-7b-instruct-v0.2, frq@panel: the label rescore wrote)."),
    sample: int = typer.Option(..., "--sample", min=1, help="How many items to review (stratified by the judge's verdict and format/arm/model; all when N >= the items)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sample (the same seed and N give the same sample)."),
    reviewer: Optional[str] = typer.Option(None, "--reviewer", help="Your name: labels go to RUN_DIR/reviews/<reviewer>.jsonl (default: your login). "
                                                                   "A second reviewer opens the page with ?reviewer=NAME."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (default: this machine only; another one needs a key)."),
    port: int = typer.Option(8765, "--port", help="Port to listen on."),
    api_key: Optional[str] = typer.Option(None, envvar="MEDSTACK_API_KEY", show_envvar=True,
                                          help="Key the page must be opened with (/?key=KEY), required off loopback (default: $MEDSTACK_API_KEY)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Allow a non-loopback --host without a key (an open page, on purpose)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Write one self-contained page here instead of serving: it keeps labels in the browser "
                                                                "and downloads them as <reviewer>.jsonl for `calibrate --labels`."),
) -> None:
    """Serve a local page where a clinician labels a blind, stratified, reproducible sample of one judge's
    decisions on the judge's own scale (keyboard shortcuts, progress bar, skip, back). The sample is written to
    RUN_DIR/reviews/sample-<judge>.json first; each label is appended to RUN_DIR/reviews/<reviewer>.jsonl as it
    is entered, so a reload or a new server resumes. The page shows items by number only (no record id, model,
    arm or run name); the server takes labels only from its own page (its Host, its Origin, its per-server token,
    JSON). Exit 2 bad input, 3 the port cannot be bound."""
    from experiments.tools.review.judges import load_judge
    from experiments.tools.review.labels import check_reviewer, write_sample
    from experiments.tools.review.page import PortBusy, export as export_page, serve
    from models.errors import DataError
    from serving.secrets import check_exposure

    who = check_reviewer(reviewer or _default_reviewer())
    if export is None:
        check_exposure(host, api_key, no_auth)
    j = load_judge(run_dir, judge)
    s = {**write_sample(run_dir, j, sample, seed), "scale": j["scale"]}  # the scale (and its question) as this version words it
    items = {it["id"]: it for it in j["items"]}
    missing = [x["id"] for x in s["items"] if x["id"] not in items]
    if missing:
        raise DataError(f"{run_dir}/reviews/sample-{judge}.json names item(s) the run no longer has: {', '.join(missing[:5])}")
    log = lambda m: typer.echo(m, err=True)
    log(f"sample: {len(s['items'])} of {s['population']} items in {len(s['strata'])} strata, seed {seed} -> {run_dir / 'reviews' / f'sample-{judge}.json'}")
    if export is not None:
        path = export_page(run_dir, s, items, who, export)
        typer.echo(str(path.resolve()))
        return
    try:
        serve(run_dir, s, items, who, host, port, api_key, log=log)
    except PortBusy as e:
        log(f"error: {e}")
        raise typer.Exit(3)


def register(app, **_) -> None:
    app.command("review")(review)
