// A session's side panels: its checkpoints (each one's diff, a restore with the drift
// question: docs/checkpoints.md) and its tree (the branches, moving to one, forking from
// any entry).

import { html } from "./preact-htm.js";
import { act, link, may, update } from "./state.js";
import { Diff, textOf as messageText } from "./transcript.js";

// Read again once the session is attached, and when a run settles (`s.refreshPanels`).
export async function loadPanels(s) {
  const [checkpoints, tree] = await Promise.all([
    link.ask("get_checkpoints").catch(() => ({ checkpoints: [] })),
    link.ask("get_tree").catch(() => ({ tree: [], leafId: null })),
  ]);
  s.checkpoints = checkpoints.checkpoints;
  s.tree = tree;
  update();
}

const KINDS = { before: "Before the run", after: "After the run", restore: "Before a restore" };

export function Checkpoints({ s }) {
  const showDiff = (id) => act(async () => {
    s.diffs[id] = s.diffs[id] ? null : await link.ask("get_checkpoint_diff", { entryId: id });
  });
  const restore = (id, force) => act(async () => {
    if (!force) {
      const plan = await link.ask("restore_checkpoint", { entryId: id, dryRun: true });
      if (plan.drift && plan.drift.length) {
        s.restoring = { id, drift: plan.drift };
        return;
      }
    }
    const done = await link.ask("restore_checkpoint", { entryId: id, force: !!force });
    s.restoring = null;
    s.restored = `Restored ${done.files.length} file(s); the files as they were are checkpoint ${done.entryId}.`;
    await loadPanels(s);
  });
  return html`<section class="panel" aria-labelledby="checkpoints-heading">
    <h2 id="checkpoints-heading">Checkpoints</h2>
    ${s.restored ? html`<p role="status" class="note">${s.restored}</p>` : ""}
    ${s.restoring ? html`<div role="group" class="dialog" aria-labelledby="drift-heading">
      <h3 id="drift-heading">Changed since forged last saw them</h3>
      <ul>${s.restoring.drift.map((f) => html`<li><code>${f.path}</code> (${f.status})</li>`)}</ul>
      <p>Restoring writes over these changes.</p>
      <button type="button" class="danger" onClick=${() => restore(s.restoring.id, true)}>Restore anyway</button>
      <button type="button" onClick=${() => { s.restoring = null; update(); }}>Keep my changes</button>
    </div>` : ""}
    ${s.checkpoints.length === 0 ? html`<p class="note">No checkpoint yet: a run that changes files takes them.</p>` : ""}
    <ol class="checkpoints">
      ${[...s.checkpoints].reverse().map((c) => html`<li>
        <div><strong>${KINDS[c.kind] || c.kind}</strong> <span class="when">${new Date(c.timestamp).toLocaleTimeString()}</span></div>
        ${c.prompt ? html`<div class="prompt-text">${c.prompt}</div>` : ""}
        <div class="files">${c.files.map((f) => html`<code>${f.status} ${f.path}</code> `)}</div>
        <button type="button" aria-expanded=${!!s.diffs[c.entryId]} onClick=${() => showDiff(c.entryId)}>Show diff</button>
        ${may("control") ? html`<button type="button" onClick=${() => restore(c.entryId, false)}>Restore</button>` : ""}
        ${s.diffs[c.entryId] ? html`<${Diff} text=${s.diffs[c.entryId].diff || "(no change)"} />` : ""}
      </li>`)}
    </ol>
  </section>`;
}

// A message in a line: its text, else the tools it called.
function textOf(message) {
  const text = messageText(message);
  if (text) return text;
  const calls = (message.content || []).filter((b) => b.type === "toolCall").map((b) => b.name);
  return calls.length ? `called ${calls.join(", ")}` : "";
}

// The user's and the assistant's messages of the tree (other entries passed through), each
// with its own such children. Built without recursion: a tree nests as deep as the session
// is long.
function shown(roots) {
  const out = [];
  const stack = roots.map((node) => [node, out]).reverse();
  while (stack.length) {
    const [node, into] = stack.pop();
    const message = node.entry.type === "message" ? node.entry.message : null;
    let below = into;
    if (message && (message.role === "user" || message.role === "assistant")) {
      const item = { node, message, children: [] };
      into.push(item);
      below = item.children;
    }
    for (let i = node.children.length - 1; i >= 0; i--) stack.push([node.children[i], below]);
  }
  return out;
}

function onBranch(tree, leafId) {
  const parents = new Map();
  const stack = [...tree];
  while (stack.length) {
    const node = stack.pop();
    parents.set(node.entry.id, node.entry.parentId);
    stack.push(...node.children);
  }
  const path = new Set();
  for (let id = leafId; id; id = parents.get(id)) path.add(id);
  return path;
}

export function Tree({ s }) {
  const active = onBranch(s.tree.tree, s.tree.leafId);
  const move = (id) => act(async () => {
    s.tree = await link.ask("navigate_tree", { entryId: id });
    await loadPanels(s);
    const messages = await link.ask("get_messages");
    s.t.messages = messages.messages;
  });
  const fork = (id) => act(async () => {
    await link.ask("clone", { entryId: id });
    const state = await link.ask("get_state");
    location.hash = `#/s/${state.sessionId}`;
  });
  const row = ({ node, message }) => {
    const here = active.has(node.entry.id);
    const words = textOf(message);
    return html`<li class=${here ? "on-branch" : ""} aria-current=${here ? "true" : undefined}>
      <span class="entry"><span class="kind">${message.role === "user" ? "You" : "Assistant"}</span>${" "}${words.slice(0, 80)}</span>
      ${may("control") ? html`<span class="entry-actions">
        <button type="button" onClick=${() => move(node.entry.id)} aria-label=${`Move here: ${words.slice(0, 40)}`}>Move here</button>
        <button type="button" onClick=${() => fork(node.entry.id)} aria-label=${`Fork here: ${words.slice(0, 40)}`}>Fork here</button>
      </span>` : ""}
    </li>`;
  };
  // A run of entries with one child each is one list; each branch point holds one list per
  // branch, so the page nests only as deep as the session branches.
  const branch = (items) => {
    const rows = [];
    let level = items;
    while (level.length === 1) {
      rows.push(row(level[0]));
      level = level[0].children;
    }
    if (level.length > 1) {
      rows.push(html`<li class="branches">${level.map((item) => html`<div class="branch">${branch([item])}</div>`)}</li>`);
    }
    return html`<ul>${rows}</ul>`;
  };
  const items = shown(s.tree.tree);
  return html`<section class="panel tree" aria-labelledby="tree-heading">
    <h2 id="tree-heading">Tree</h2>
    ${items.length ? branch(items) : html`<p class="note">No message yet.</p>`}
  </section>`;
}
