// Markdown to HTML for the transcript: paragraphs, headings, lists, quotes, fenced code,
// inline code, emphasis and links. Everything is escaped first; a link is kept only when it
// is http(s) or mailto, so text from a model or a tool never becomes markup or script.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

function inline(text) {
  const codes = [];
  // (NUL and SOH mark what is set aside below: none comes from the text)
  let out = escapeHtml(text.replace(/[\u0000\u0001]/g, "")).replace(/`([^`\n]+)`/g, (_, code) => {
    codes.push(code);
    return `\u0000${codes.length - 1}\u0000`;
  });
  const links = [];
  out = out
    // Bounded: each try reads 300 characters at most (a run of "[" stays linear). A link's
    // address is set aside, as code is, so that no emphasis is made inside it.
    .replace(/\[([^[\]\n]{1,300})\]\(((?:https?:\/\/|mailto:)[^\s()]{1,2000})\)/g, (_, label, href) => {
      links.push(href);
      return `<a href="\u0001${links.length - 1}\u0001" rel="noopener noreferrer" target="_blank">${label}</a>`;
    })
    .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w*])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w_])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>");
  return out
    .replace(/\u0001(\d+)\u0001/g, (_, i) => links[Number(i)])
    .replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${codes[Number(i)]}</code>`);
}

const rendered = new Map(); // text -> HTML: a transcript is drawn again on every frame
const KEPT = 500;

export function renderMarkdown(text) {
  let html = rendered.get(text);
  if (html === undefined) {
    html = render(text);
    if (rendered.size >= KEPT) rendered.delete(rendered.keys().next().value);
    rendered.set(text, html);
  }
  return html;
}

function render(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const html = [];
  let paragraph = [];
  let list = null; // "ul" or "ol"
  const flush = () => {
    if (paragraph.length) html.push(`<p>${inline(paragraph.join("\n"))}</p>`);
    paragraph = [];
  };
  const closeList = () => {
    if (list) html.push(`</${list}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)\s*$/);
    if (fence) {
      flush();
      closeList();
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) body.push(lines[i]);
      const language = fence[2] ? ` data-language="${escapeHtml(fence[2])}"` : "";
      html.push(`<pre${language}><code>${escapeHtml(body.join("\n"))}</code></pre>`);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const item = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/);
    if (heading) {
      flush();
      closeList();
      const level = Math.min(heading[1].length + 2, 6); // under the page's own headings
      html.push(`<h${level}>${inline(heading[2])}</h${level}>`);
    } else if (item) {
      flush();
      const kind = item[1] ? "ul" : "ol";
      if (list !== kind) {
        closeList();
        html.push(`<${kind}>`);
        list = kind;
      }
      html.push(`<li>${inline(item[3])}</li>`);
    } else if (line.startsWith(">")) {
      flush();
      closeList();
      html.push(`<blockquote>${inline(line.replace(/^>\s?/, ""))}</blockquote>`);
    } else if (!line.trim()) {
      flush();
      closeList();
    } else {
      if (list) closeList();
      paragraph.push(line);
    }
  }
  flush();
  closeList();
  return html.join("");
}
