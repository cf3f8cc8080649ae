"""The review page: one HTML file (its CSS and JS inline, nothing from the network), served by a small
aiohttp server on this machine or written whole for a reviewer who works offline.

The request guard, the key, the labels' path and what the page is never shown (blind review) are described in
experiments/tools/review/README.md; :func:`refusal` is the one guard every request passes. The data is embedded with
:func:`models.jsontext.for_script`, so any text a model wrote shows as written.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from pathlib import Path

from aiohttp import web
from jinja2 import Environment, FileSystemLoader, select_autoescape

from experiments.core.results import write_private
from experiments.tools.review.labels import append_label, check_label, check_reviewer, read_labels, sample_tag
from models.errors import DataError, MedstackError, StorageError
from models.jsontext import for_script
from serving.secrets import is_loopback_host

TEMPLATES = Path(__file__).with_name("templates")
KEY_HEADER = "X-Review-Key"
TOKEN_HEADER = "X-Review-Token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class PortBusy(MedstackError):
    """The port cannot be bound (exit 3: the environment, not the input)."""


def page_data(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, mode: str, token: str | None = None) -> dict:
    """What the page holds: the blind items in sample order, numbered 1..N, and this reviewer's labels so far
    (served mode), keyed by those numbers."""
    number = {s["id"]: k for k, s in enumerate(sample["items"], 1)}
    labels = {}
    if mode == "server" and (run_dir / "reviews" / f"{reviewer}.jsonl").exists():
        mine = read_labels(run_dir / "reviews" / f"{reviewer}.jsonl", run_dir).get(reviewer, {})
        labels = {str(number[item]): {"label": row.get("label"), "skipped": bool(row.get("skipped")), "comment": row.get("comment") or ""}
                  for (judge, item), row in mine.items() if judge == sample["judge"] and item in number}
    step = sample["judge"].partition("@")[0]  # STEP@LABEL: the label names a judge model, which the page never shows
    data = {"mode": mode, "judge": step, "sample": sample_tag(sample), "scale": sample["scale"], "reviewer": reviewer,
            "items": [{"n": k, "show": items[s["id"]]["show"]} for k, s in enumerate(sample["items"], 1)], "labels": labels}
    if token:
        data["token"] = token
    return data


def render_page(data: dict) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"], default=True))
    return env.get_template("page.html.j2").render(
        data=for_script(data), title=f"medstack review: judge {data['judge']}",
        css=(TEMPLATES / "page.css").read_text(encoding="utf-8"), js=(TEMPLATES / "page.js").read_text(encoding="utf-8"))


def export(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, out: Path) -> Path:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError.from_os(out, e) from None
    write_private(out, render_page(page_data(run_dir, sample, items, reviewer, "file")))
    return out


def _hosts(bound: str, sockname) -> set[str]:
    """The Host values this server answers to: the bound name and the address the connection came in on
    (a wildcard bind is not a name), on loopback also localhost / 127.0.0.1 / [::1]; each with the port."""
    if not sockname:
        return set()
    addr, port = str(sockname[0]).split("%")[0], sockname[1]
    names = {n.strip("[]").lower() for n in (bound, addr)} - {"0.0.0.0", "::", ""}
    if is_loopback_host(bound) or is_loopback_host(addr):
        names |= set(LOOPBACK_NAMES)
    names = {f"[{n}]" if ":" in n else n for n in names}
    return {f"{n}:{port}" for n in names} | (names if port == 80 else set())


def refusal(request, bound: str, key: str | None, token: str):
    """The guard every request passes: None, or the response refusing it (nothing is read or written)."""
    host = (request.headers.get("Host") or "").lower()
    answers_to = _hosts(bound, request.transport.get_extra_info("sockname") if request.transport else None)
    if host not in answers_to:
        return web.json_response({"error": f"this server does not answer to Host {host!r}: open the page at "
                                           + " or ".join(f"http://{h}/" for h in sorted(answers_to))}, status=421)
    origin = request.headers.get("Origin")
    if origin is not None and origin.lower() != f"http://{host}":
        return web.json_response({"error": f"requests from {origin!r} are refused: only the review page itself may send them"}, status=403)
    if key:
        given = request.headers.get(KEY_HEADER) or request.query.get("key") or ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            if request.method == "GET":
                return web.Response(status=401, text="this review page needs its key: open it as /?key=KEY")
            return web.json_response({"error": "wrong or missing key"}, status=401)
    if request.method not in ("GET", "HEAD"):
        if not hmac.compare_digest((request.headers.get(TOKEN_HEADER) or "").encode(), token.encode()):
            return web.json_response({"error": "missing or wrong page token: labels are taken only from this server's own page"}, status=403)
        if request.content_type != "application/json":
            return web.json_response({"error": f"a label is sent as application/json, not {request.content_type}"}, status=415)
    return None


def make_app(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, key: str | None, host: str = "127.0.0.1"):
    ids = [s["id"] for s in sample["items"]]  # item number k (1..N) is ids[k - 1]
    token = secrets.token_urlsafe(32)  # this server's: only the pages it served know it
    lock = asyncio.Lock()

    @web.middleware
    async def guard(request, handler):
        refused = refusal(request, host, key, token)
        return refused if refused is not None else await handler(request)

    async def index(request):
        who = request.query.get("reviewer") or reviewer
        try:
            check_reviewer(who, "reviewer")
            html = render_page(page_data(run_dir, sample, items, who, "server", token))
        except DataError as e:
            return web.Response(status=400, text=str(e))
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    async def label(request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise DataError("expected a JSON object")
            who, n = check_reviewer(str(body.get("reviewer") or ""), "reviewer"), body.get("item")
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids):
                raise DataError(f"item {n!r} is not an item number of the sample (1..{len(ids)})")
            skipped = bool(body.get("skipped"))
            value = None if skipped else check_label(body.get("label"), sample["scale"], f"item {n}")
            if value is None and not skipped:
                raise DataError(f"item {n}: no label (send skipped: true to skip)")
            comment = str(body.get("comment") or "")[:4000]
        except (ValueError, DataError) as e:
            return web.json_response({"error": str(e)}, status=400)
        async with lock:  # one writer at a time: lines never interleave
            append_label(run_dir, who, {"judge": sample["judge"], "item": ids[n - 1], "label": value, "skipped": skipped, "comment": comment})
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024, middlewares=[guard])
    app.add_routes([web.get("/", index), web.post("/api/label", label)])
    return app


def serve(run_dir: Path, sample: dict, items: dict[str, dict], reviewer: str, host: str, port: int, key: str | None, log=print) -> None:
    """Serve the page until interrupted."""
    async def main():
        runner = web.AppRunner(make_app(run_dir, sample, items, reviewer, key, host), access_log=None)
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
