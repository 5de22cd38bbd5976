// A message's file part (docs/files.md): an image shown inline, any other file as a download.
// A hub file (/files/{sha256}) is fetched with the inspector's token (an <img src> or a link
// cannot send Authorization), then shown from a blob: URL; a data: image (a message written
// before the hub stored files) is shown as it is; other URLs are only linked.
import { token } from "./model.js";
import { h } from "./util.js";

const HUB_FILE = /^\/files\/[0-9a-f]{64}$/;

/** The hub file's bytes as a blob: URL (the token sent when there is one). */
async function blobUrl(url) {
  const t = token();
  const r = await fetch(url, { headers: t ? { authorization: `Bearer ${t}` } : {} });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return URL.createObjectURL(await r.blob());
}

function download(url, filename) {
  return async (e) => {
    e.preventDefault();
    const link = e.currentTarget;
    try {
      const href = await blobUrl(url);
      const a = h("a", { href, download: filename });
      a.click();
      setTimeout(() => URL.revokeObjectURL(href), 60_000);
    } catch (err) {
      link.textContent = `download failed (${err.message})`;
    }
  };
}

export function filePartEl(part) {
  const url = typeof part.url === "string" ? part.url : "";
  const media = String(part.mediaType ?? "");
  const name = part.filename ?? "file";
  const label = `${name} (${media || "unknown type"})`;
  const image = /^image\//i.test(media) && !/svg/i.test(media);
  if (HUB_FILE.test(url)) {
    if (image) {
      const img = h("img", { alt: part.filename ?? "attached image", "data-file": url });
      blobUrl(url).then(
        (src) => { img.src = src; },
        () => { img.alt = `${label}: not readable with this token`; },
      );
      return h("figure", { class: "part file image" }, img, h("figcaption", { text: label }));
    }
    return h(
      "div",
      { class: "part file" },
      `File: ${label} `,
      h("a", { href: url, download: name, class: "download", "data-file": url, onclick: download(url, name), text: "download" }),
    );
  }
  const safe = /^(https?:|data:)/i.test(url);
  return h(
    "div",
    { class: "part file" },
    `File: ${label} `,
    safe && /^data:image\//i.test(url) && !/svg/i.test(url) ? h("img", { src: url, alt: part.filename ?? "attached image" }) : null,
    safe ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer", text: "open" }) : null,
  );
}
