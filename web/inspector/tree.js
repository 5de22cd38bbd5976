// The tree view: one node per message, depth down (row), branches side by side (lanes).
// The layout of the whole tree is computed once per change of its structure (O(messages));
// drawing is virtualized: only the rows (and lanes) in the viewport are in the SVG, so a
// 10,000-message session with 200 branches keeps a few hundred DOM nodes.
import { plural, short, textOf } from "./util.js";

const ROW = 18; // px per row (depth)
const COL = 16; // px per lane
const PAD = 10;
const OVERSCAN = 6; // rows drawn beyond the viewport, so a small scroll shows no gap
const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  return el;
}

/**
 * Rows and lanes of every message. A branch (a chain through first children) keeps one
 * lane; a later child starts a new branch in the nearest free lane right of its parent's,
 * reusing a lane whose branch ended above it, so the picture stays narrow.
 */
export function layout(model) {
  const pos = new Map(); // id -> {row, lane}
  const byRow = []; // row -> [id]
  const laneEnd = []; // lane -> last row used
  // Branches in the order they are met, top down (a queue), so that a lane freed by a
  // branch that ended is found by the next one below it.
  const queue = model.roots.map((id) => [id, -1, 0]);
  for (let q = 0; q < queue.length; q++) {
    const [start, parentLane, row] = queue[q];
    let length = 0;
    for (let n = model.nodes.get(start); n; n = n.children.length ? model.nodes.get(n.children[0]) : null) length++;
    let lane = -1;
    for (let l = parentLane + 1; l < laneEnd.length; l++) {
      if (laneEnd[l] < row - 1) {
        lane = l;
        break;
      }
    }
    if (lane < 0) lane = laneEnd.length;
    laneEnd[lane] = row + length - 1;
    let r = row;
    for (let n = model.nodes.get(start); n; r++) {
      pos.set(n.id, { row: r, lane });
      (byRow[r] ??= []).push(n.id);
      for (let c = 1; c < n.children.length; c++) queue.push([n.children[c], lane, r + 1]);
      n = n.children.length ? model.nodes.get(n.children[0]) : null;
    }
  }
  // An overlay covers the path from its first message to its last, which changes lane where
  // it enters a branch: its band is one box per lane it runs through, so the messages beside
  // it in the same rows (the trunk next to a branch) stay outside it.
  const overlays = [];
  const covered = new Map(); // message id -> the overlays covering it
  for (const c of model.compactions) {
    if (!pos.get(c.from_message_id) || !pos.get(c.to_message_id)) continue;
    const ids = [];
    let ok = false;
    for (let n = model.nodes.get(c.to_message_id); n; n = n.parentId ? model.nodes.get(n.parentId) : null) {
      ids.push(n.id);
      if (n.id === c.from_message_id) {
        ok = true;
        break;
      }
    }
    if (!ok) continue;
    ids.reverse();
    const segments = [];
    for (const id of ids) {
      const p = pos.get(id);
      const last = segments.at(-1);
      if (last && last.lane === p.lane && last.row1 === p.row - 1) last.row1 = p.row;
      else segments.push({ lane: p.lane, row0: p.row, row1: p.row });
    }
    const o = { id: c.id, summary: c.summary, from: c.from_message_id, to: c.to_message_id, count: ids.length, row0: segments[0].row0, row1: segments.at(-1).row1, segments };
    overlays.push(o);
    for (const id of ids) (covered.get(id) ?? covered.set(id, []).get(id)).push(o);
  }
  return { pos, byRow, lanes: laneEnd.length, rows: byRow.length, overlays, covered, version: model.structureVersion };
}

const x = (lane) => PAD + lane * COL;

export function nodeName(msg, id, onPath) {
  const text = textOf(msg).replace(/\s+/g, " ").trim();
  const excerpt = text.length > 60 ? `${text.slice(0, 60)}…` : text;
  return `${msg.role} ${short(id)}${excerpt ? `: ${excerpt}` : ""}${onPath ? " (active branch)" : ""}`;
}

/**
 * The tree widget. `actions`: {activate(id) (Enter / click: make this message's branch
 * active), describe(node) (for the status line)}.
 */
export class TreeView {
  constructor(root, status, actions) {
    this.root = root;
    this.status = status;
    this.actions = actions;
    this.canvas = root.querySelector(".tree-canvas");
    this.model = null;
    this.lay = null;
    this.path = new Set();
    this.cursor = null; // null: the active leaf
    this.queued = false;
    this.drawn = 0;
    root.addEventListener("scroll", () => this.schedule());
    root.addEventListener("keydown", (e) => this.key(e));
    root.addEventListener("click", (e) => {
      const id = e.target?.closest?.("[data-id]")?.getAttribute("data-id");
      if (!id) return;
      this.cursor = id;
      this.root.focus({ preventScroll: true });
      this.actions.activate(id);
    });
    root.addEventListener("focus", () => this.describe());
  }

  /** A new state: re-layout if the structure changed, then draw. */
  update(model, pathIds, leaf) {
    const fresh = this.model !== model;
    if (fresh) this.cursor = null;
    this.model = model;
    this.leaf = leaf;
    this.path = new Set(pathIds);
    if (fresh || !this.lay || this.lay.version !== model.structureVersion) {
      const t0 = performance.now();
      this.lay = layout(model);
      this.root.dataset.layoutMs = (performance.now() - t0).toFixed(1);
      this.canvas.style.height = `${this.lay.rows * ROW + 2 * PAD}px`;
      this.canvas.style.width = `${this.lay.lanes * COL + 2 * PAD}px`;
      this.root.dataset.rows = String(this.lay.rows);
      this.root.dataset.lanes = String(this.lay.lanes);
    }
    if (this.cursor && !model.nodes.has(this.cursor)) this.cursor = null;
    if (fresh || (this.cursor === null && leaf !== this.revealed)) {
      this.revealed = leaf;
      this.reveal(leaf);
    }
    this.draw();
    this.describe();
  }

  schedule() {
    if (this.queued) return;
    this.queued = true;
    requestAnimationFrame(() => {
      this.queued = false;
      this.draw();
    });
  }

  /** Scroll so that the message is in view. */
  reveal(id) {
    const p = id && this.lay?.pos.get(id);
    if (!p) return;
    const top = PAD + p.row * ROW;
    const r = this.root;
    if (top < r.scrollTop + ROW) r.scrollTop = Math.max(0, top - 2 * ROW);
    else if (top > r.scrollTop + r.clientHeight - 2 * ROW) r.scrollTop = top - r.clientHeight + 3 * ROW;
    const left = x(p.lane);
    if (left < r.scrollLeft + COL) r.scrollLeft = Math.max(0, left - 2 * COL);
    else if (left > r.scrollLeft + r.clientWidth - 2 * COL) r.scrollLeft = left - r.clientWidth + 3 * COL;
  }

  draw() {
    const lay = this.lay;
    const model = this.model;
    if (!lay || !model) return;
    const t0 = performance.now();
    const r = this.root;
    const first = Math.max(0, Math.floor((r.scrollTop - PAD) / ROW) - OVERSCAN);
    const last = Math.min(lay.rows - 1, Math.ceil((r.scrollTop + r.clientHeight) / ROW) + OVERSCAN);
    const col0 = Math.floor((r.scrollLeft - PAD) / COL) - 2;
    const col1 = Math.ceil((r.scrollLeft + r.clientWidth) / COL) + 2;
    const top = PAD + first * ROW;
    const y = (row) => (row - first) * ROW + ROW / 2;
    const height = Math.max(0, last - first + 1) * ROW;
    const out = svg("svg", { class: "tree-svg", width: lay.lanes * COL + 2 * PAD, height, style: `top:${top}px`, "aria-hidden": "true" });
    for (const o of lay.overlays) {
      if (o.row1 < first || o.row0 > last) continue;
      const band = svg("g", { class: "t-band", "data-compaction": o.id });
      const title = svg("title", {});
      title.textContent = `Compaction of ${plural(o.count, "message")} (${short(o.from)} → ${short(o.to)}): ${o.summary}`;
      band.append(title);
      for (const seg of o.segments) {
        if (seg.row1 < first || seg.row0 > last) continue;
        const a = Math.max(seg.row0, first - 1);
        const b = Math.min(seg.row1, last + 1);
        band.append(svg("rect", { class: "t-overlay", x: x(seg.lane) - 7, y: y(a) - 8, width: 14, height: (b - a) * ROW + 16, rx: 6 }));
      }
      out.append(band);
    }
    const edges = svg("g", { class: "t-edges" });
    const dots = svg("g", { class: "t-nodes" });
    let count = 0;
    for (let row = first; row <= last; row++) {
      for (const id of lay.byRow[row] ?? []) {
        const n = model.nodes.get(id);
        const p = lay.pos.get(id);
        const parent = n.parentId ? lay.pos.get(n.parentId) : null;
        const on = this.path.has(id);
        if (parent && Math.max(p.lane, parent.lane) >= col0 && Math.min(p.lane, parent.lane) <= col1) {
          const cls = on && this.path.has(n.parentId) ? "t-edge on" : "t-edge";
          const d = parent.lane === p.lane ? `M${x(p.lane)},${y(parent.row)}V${y(p.row)}` : `M${x(parent.lane)},${y(parent.row)}C${x(parent.lane)},${y(p.row)} ${x(p.lane)},${y(parent.row)} ${x(p.lane)},${y(p.row)}`;
          edges.append(svg("path", { class: cls, d }));
        }
        if (p.lane < col0 || p.lane > col1) continue;
        const cls = [`t-node`, n.msg.role, on ? "on" : "", id === this.leaf ? "leaf" : "", id === this.cursor ? "cursor" : ""].filter(Boolean).join(" ");
        const dot = svg("circle", { class: cls, cx: x(p.lane), cy: y(p.row), r: on ? 5 : 4, "data-id": id });
        // A hover names the node: its role, id and the start of its text (the tree's label
        // and live status say the same of the selected node to a screen reader).
        const name = svg("title", {});
        name.textContent = nodeName(n.msg, id, on);
        dot.append(name);
        dots.append(dot);
        count++;
      }
    }
    out.append(edges, dots);
    const old = this.canvas.querySelector("svg");
    if (old) old.replaceWith(out);
    else this.canvas.append(out);
    this.drawn = count;
    r.dataset.firstRow = String(first);
    r.dataset.drawn = String(count);
    r.dataset.drawMs = (performance.now() - t0).toFixed(1);
  }

  current() {
    return this.cursor ?? this.leaf;
  }

  describe() {
    const id = this.current();
    const n = id && this.model?.nodes.get(id);
    if (!n) {
      this.status.textContent = this.model?.nodes.size ? "" : "No messages yet";
      return;
    }
    const p = this.lay.pos.get(id);
    const sibs = n.parentId ? this.model.nodes.get(n.parentId).children : this.model.roots;
    const parts = [
      `${n.msg.role} ${short(id)}`,
      `depth ${p.row + 1}`,
      sibs.length > 1 ? `branch ${sibs.indexOf(id) + 1} of ${sibs.length}` : null,
      n.children.length > 1 ? `forks into ${n.children.length}` : null,
      this.path.has(id) ? "on the active branch" : null,
      ...(this.lay.covered.get(id) ?? []).map((o) => `compacted: ${o.summary.slice(0, 60)}`),
      textOf(n.msg).slice(0, 80) || null,
    ];
    this.status.textContent = parts.filter(Boolean).join(" · ");
    this.root.setAttribute("aria-label", `Message tree: ${plural(this.model.nodes.size, "message")} in ${plural(this.lay.lanes, "lane")}. Selected: ${this.status.textContent}. Arrow keys move, Enter shows that branch.`);
  }

  key(e) {
    const model = this.model;
    const id = this.current();
    const n = id && model?.nodes.get(id);
    if (!n) return;
    let next = null;
    const sibs = n.parentId ? model.nodes.get(n.parentId).children : model.roots;
    const k = sibs.indexOf(id);
    if (e.key === "ArrowUp") next = n.parentId;
    else if (e.key === "ArrowDown") next = n.children.find((c) => this.path.has(c)) ?? n.children[0];
    else if (e.key === "ArrowLeft") next = sibs[k - 1];
    else if (e.key === "ArrowRight") next = sibs[k + 1];
    else if (e.key === "Home") next = model.roots[0];
    else if (e.key === "End") next = model.newestUnder(id);
    else if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      this.actions.activate(id);
      return;
    } else return;
    e.preventDefault();
    if (!next) return;
    this.cursor = next;
    this.reveal(next);
    this.draw();
    this.describe();
  }
}
