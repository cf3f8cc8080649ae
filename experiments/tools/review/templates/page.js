// The review page: one item at a time, labels on the judge's own scale, saved before moving on.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("review-data").textContent);
  const items = D.items, scale = D.scale, labels = D.labels || {};
  const params = new URLSearchParams(location.search);
  const key = params.get("key") || "";
  let reviewer = D.reviewer;
  const $ = (id) => document.getElementById(id);
  // items are known by their number in the sample (1..N), never by a record id; D.sample names the sample opaquely
  const storeKey = () => "medstack-review:" + D.sample + ":" + reviewer;
  let history = [];  // file mode: every line entered, downloaded as <reviewer>.jsonl

  function loadLocal() {
    history = JSON.parse(localStorage.getItem(storeKey()) || "[]");
    for (const k of Object.keys(labels)) delete labels[k];
    for (const line of history) labels[line.n] = {label: line.label, skipped: line.skipped, comment: line.comment};
  }

  function firstOpen() {
    const i = items.findIndex((it) => !labels[it.n]);
    return i < 0 ? items.length : i;
  }

  let idx = 0;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function keyFor(v) {
    if (scale.kind === "binary") return v === 1 ? "m / 1" : "n / 0";
    return String(v);
  }

  function nameOf(v) {
    return scale.kind === "binary" ? scale.names[String(v)] : String(v);
  }

  function renderProgress() {
    const done = items.filter((it) => labels[it.n] && !labels[it.n].skipped).length;
    const skipped = items.filter((it) => labels[it.n] && labels[it.n].skipped).length;
    $("bar").style.width = (100 * (done + skipped) / Math.max(items.length, 1)) + "%";
    $("progress-text").textContent = done + " of " + items.length + " labelled" + (skipped ? ", " + skipped + " skipped" : "") +
      (idx < items.length ? " · item " + (idx + 1) : " · all done");
    document.body.dataset.labelled = String(done);
  }

  function render() {
    const box = $("item");
    box.replaceChildren();
    const scaleBox = $("scale");
    scaleBox.replaceChildren();
    if (idx >= items.length) {
      box.append(el("p", "All " + items.length + " items have a label or a skip. Use back to revise one."));
      document.body.dataset.item = "";
      $("comment").value = "";
      renderProgress();
      return;
    }
    const it = items[idx];
    document.body.dataset.item = String(it.n);
    box.append(el("p", "item " + it.n + " of " + items.length, "id"));
    if (scale.question) box.append(el("p", scale.question, "question"));
    for (const [name, value] of Object.entries(it.show)) {
      box.append(el("h2", name));
      if (Array.isArray(value)) {
        const ol = el("ol");
        for (const v of value) ol.append(el("li", String(v)));
        box.append(ol);
      } else {
        box.append(el("p", value === null || value === undefined ? "" : String(value)));
      }
    }
    const prev = labels[it.n];
    if (scale.kind === "unit") {
      const inp = el("input");
      inp.type = "number"; inp.min = "0"; inp.max = "1"; inp.step = "0.05"; inp.id = "unit";
      inp.placeholder = "0 to 1";
      if (prev && prev.label !== null && prev.label !== undefined) inp.value = prev.label;
      const ok = el("button", "save ⏎");
      ok.type = "button";
      ok.onclick = () => submitUnit(inp.value);
      inp.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); submitUnit(inp.value); } });
      scaleBox.append(inp, ok);
    } else {
      for (const v of scale.values) {
        const b = el("button");
        b.type = "button";
        b.dataset.value = String(v);
        b.append(nameOf(v) + " ", el("kbd", keyFor(v)));
        if (prev && prev.label === v) b.className = "chosen";
        b.onclick = () => submit(v, false);
        scaleBox.append(b);
      }
    }
    $("comment").value = prev ? prev.comment || "" : "";
    renderProgress();
  }

  function submitUnit(raw) {
    const v = Number(raw);
    if (raw === "" || !(v >= 0 && v <= 1)) { status("enter a number from 0 to 1", false); return; }
    submit(v, false);
  }

  function status(text, ok) {
    $("status").textContent = text;
    $("status").className = ok ? "ok" : "";
  }

  let busy = false;
  async function submit(value, skipped) {
    if (busy || idx >= items.length) return;
    const it = items[idx];
    const entry = {label: skipped ? null : value, skipped: skipped, comment: $("comment").value};
    busy = true;
    try {
      if (D.mode === "server") {
        const headers = {"Content-Type": "application/json", "X-Review-Token": D.token};
        if (key) headers["X-Review-Key"] = key;
        const r = await fetch("api/label", {method: "POST", headers: headers, body: JSON.stringify({...entry, item: it.n, reviewer: reviewer})});
        const body = await r.json().catch(() => ({}));
        if (!r.ok) { status("not saved: " + (body.error || ("HTTP " + r.status)), false); return; }
      } else {
        // the downloaded line names the item by number and the sample by its tag: calibrate looks the id up in the sample file
        history.push({judge: D.judge, n: it.n, sample: D.sample, ...entry, reviewer: reviewer, at: new Date().toISOString().replace(/\.\d+Z$/, "Z")});
        localStorage.setItem(storeKey(), JSON.stringify(history));
      }
      labels[it.n] = {label: entry.label, skipped: skipped, comment: entry.comment};
      status(skipped ? "skipped item " + it.n : "saved item " + it.n + ": " + nameOf(value), true);
      idx = Math.min(idx + 1, items.length);
      render();
    } catch (e) {
      status("not saved: " + e, false);
    } finally {
      busy = false;
    }
  }

  function back() {
    if (idx > 0) { idx -= 1; render(); }
  }

  function download() {
    const text = history.map((l) => JSON.stringify(l)).join("\n") + (history.length ? "\n" : "");
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], {type: "application/x-ndjson"}));
    a.download = reviewer + ".jsonl";
    document.body.append(a);
    a.click();
    a.remove();
  }

  function keyLabel(k) {
    if (scale.kind === "binary") {
      if (k === "m" || k === "1") return 1;
      if (k === "n" || k === "0") return 0;
      return undefined;
    }
    if (scale.kind === "unit") return undefined;
    const v = Number(k);
    return /^[0-9]$/.test(k) && scale.values.includes(v) ? v : undefined;
  }

  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (t && (t.tagName === "TEXTAREA" || t.tagName === "INPUT")) {
      if (e.key === "Escape") t.blur();
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const v = keyLabel(e.key);
    if (v !== undefined) { e.preventDefault(); submit(v, false); return; }
    if (e.key === "s") { e.preventDefault(); submit(null, true); }
    else if (e.key === "b" || e.key === "ArrowLeft") { e.preventDefault(); back(); }
    else if (e.key === "ArrowRight" && idx < items.length && labels[items[idx].n]) { e.preventDefault(); idx += 1; render(); }
    else if (e.key === "c") { e.preventDefault(); $("comment").focus(); }
    else if (e.key === "u" && scale.kind === "unit") { e.preventDefault(); const u = $("unit"); if (u) u.focus(); }
    else if (e.key === "d" && D.mode === "file") { e.preventDefault(); download(); }
  });

  $("back").onclick = back;
  $("skip").onclick = () => submit(null, true);
  const scaleKeys = scale.kind === "binary" ? "m or 1 match, n or 0 no match" :
    scale.kind === "unit" ? "u then a number and Enter" : scale.values.join(" ") + " label";
  $("keys").textContent = "keys: " + scaleKeys + " · s skip · b or ← back · → next labelled · c comment" + (D.mode === "file" ? " · d download" : "");
  if (D.mode === "file") {
    $("download").hidden = false;
    $("download").onclick = download;
    const inp = el("input");
    inp.id = "reviewer";
    inp.value = reviewer;
    inp.addEventListener("change", () => {
      if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/.test(inp.value)) { status("reviewer name: letters, digits, _ . -", false); inp.value = reviewer; return; }
      reviewer = inp.value; loadLocal(); idx = firstOpen(); render();
    });
    $("who").append("reviewer: ", inp, " (labels stay in this browser until you download them as ", el("code", "<reviewer>.jsonl"), ")");
    loadLocal();
  } else {
    $("who").textContent = "reviewer: " + reviewer + " (each label is saved on the research machine as you enter it)";
  }
  idx = firstOpen();
  render();
  document.body.dataset.ready = "1";
})();
