"""The review page: one HTML file (its CSS and JS inline, nothing from the network), served by a small
aiohttp server on this machine or written whole for a reviewer who works offline.

Served (``serve``): labels go to ``POST /api/label`` and are appended to ``RUN_DIR/reviews/<reviewer>.jsonl``
before the page moves on; a reload (or a new server) embeds the labels so far and opens the first
item without one. A non-loopback ``--host`` needs a key (:func:`serving.secrets.check_exposure`): the
page is opened as ``/?key=KEY`` and sends it back in a header; the access log is off, so the key is
never written anywhere.

Exported (``export``): the same page keeps its labels in the browser (localStorage) and offers them
as ``<reviewer>.jsonl`` to download, the file ``medstack calibrate --labels`` reads.

The page gets each item's id and what the protocol gives the judge -- never the verdict or the stratum.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from pathlib import Path

from aiohttp import web
from jinja2 import Environment, FileSystemLoader, select_autoescape

from experiments.review.labels import append_label, check_label, check_reviewer, read_labels
from models.errors import DataError, MedstackError, StorageError
from models.paths import private_file

TEMPLATES = Path(__file__).with_name("templates")
KEY_HEADER = "X-Review-Key"


class PortBusy(MedstackError):
    """The port cannot be bound (exit 3: the environment, not the input)."""


def page_data(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, mode: str) -> dict:
    """What the page holds: the blind items in sample order and this reviewer's labels so far (served mode)."""
    labels = {}
    if mode == "server" and (run_dir / "reviews" / f"{reviewer}.jsonl").exists():
        mine = read_labels(run_dir / "reviews" / f"{reviewer}.jsonl").get(reviewer, {})
        labels = {item: {"label": row.get("label"), "skipped": bool(row.get("skipped")), "comment": row.get("comment") or ""}
                  for (judge, item), row in mine.items() if judge == sample["judge"]}
    return {"mode": mode, "run": run_dir.name, "judge": sample["judge"], "scale": sample["scale"], "reviewer": reviewer,
            "items": [{"id": s["id"], "show": items[s["id"]]["show"]} for s in sample["items"]], "labels": labels}


def render_page(data: dict) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"], default=True))
    blob = json.dumps(data, ensure_ascii=False).replace("</", "<\\/").replace("<!--", "<\\!--")
    return env.get_template("page.html.j2").render(
        data=blob, title=f"review: {data['judge']} of {data['run']}",
        css=(TEMPLATES / "page.css").read_text(encoding="utf-8"), js=(TEMPLATES / "page.js").read_text(encoding="utf-8"))


def export(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, out: Path) -> Path:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_page(page_data(run_dir, sample, items, reviewer, "file")), encoding="utf-8")
        private_file(out)
    except OSError as e:
        raise StorageError.from_os(out, e) from None
    return out


def make_app(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, key: str | None):
    in_sample = {s["id"] for s in sample["items"]}
    lock = asyncio.Lock()

    def authorized(request) -> bool:
        if not key:
            return True
        given = request.headers.get(KEY_HEADER) or request.query.get("key") or ""
        return hmac.compare_digest(given.encode(), key.encode())

    async def index(request):
        if not authorized(request):
            return web.Response(status=401, text="this review page needs its key: open it as /?key=KEY")
        who = request.query.get("reviewer") or reviewer
        try:
            check_reviewer(who, "reviewer")
        except DataError as e:
            return web.Response(status=400, text=str(e))
        html = render_page(page_data(run_dir, sample, items, who, "server"))
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    async def label(request):
        if not authorized(request):
            return web.json_response({"error": "wrong or missing key"}, status=401)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise DataError("expected a JSON object")
            who, item = check_reviewer(str(body.get("reviewer") or ""), "reviewer"), str(body.get("item") or "")
            if item not in in_sample:
                raise DataError(f"item {item!r} is not in the sample")
            skipped = bool(body.get("skipped"))
            value = None if skipped else check_label(body.get("label"), sample["scale"], f"item {item}")
            if value is None and not skipped:
                raise DataError(f"item {item}: no label (send skipped: true to skip)")
            comment = str(body.get("comment") or "")[:4000]
        except (ValueError, DataError) as e:
            return web.json_response({"error": str(e)}, status=400)
        async with lock:  # one writer at a time: lines never interleave
            append_label(run_dir, who, {"judge": sample["judge"], "item": item, "label": value, "skipped": skipped, "comment": comment})
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024)
    app.add_routes([web.get("/", index), web.post("/api/label", label)])
    return app


def serve(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, host: str, port: int, key: str | None, log=print) -> None:
    """Serve the page until interrupted."""
    async def main():
        runner = web.AppRunner(make_app(run_dir, sample, items, reviewer, key), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise PortBusy(f"--host {host} --port {port}: cannot listen ({e.strerror or e}); choose another --port") from None
        shown = f"[{host}]" if ":" in host else host
        log(f"review page: http://{shown}:{port}/?reviewer={reviewer}{'&key=...' if key else ''} "
            f"({len(sample['items'])} items; labels go to {run_dir / 'reviews' / (reviewer + '.jsonl')}); Ctrl-C to stop")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
