// forged's page (docs/web.md): the sessions, and one session live, through the protocol a
// paired device speaks (docs/protocol.md). What the device's role may not do is not offered.

import { html, render } from "./preact-htm.js";
import { NotPaired } from "./link.js";
import { Checkpoints, Tree, loadPanels } from "./panels.js";
import { S, act, link, may, onDraw, update } from "./state.js";
import { Transcript, applyEvent, mergeMessage, newTranscript, textOf } from "./transcript.js";

const PERMISSION_MODES = ["read-only", "ask", "auto", "full-access"];

link.onEvent = onEvent;
link.onStatus = onStatus;
onDraw(() => {
  render(html`<${Page} />`, document.getElementById("app"));
  if (S.view === "list" && !performance.getEntriesByName("forged:drawn").length) {
    performance.mark("forged:drawn"); // the sessions on screen: bench/web.py reads it
  }
});


function onStatus(status, detail) {
  if (status === "away") S.banner = "Connection lost: reconnecting…";
  else if (status === "unpaired") {
    S.view = "unpaired";
    S.problem = detail;
  } else if (status === "back") {
    S.banner = "Reconnected.";
    for (const dialog of link.dialogs || []) {
      if (S.s && !S.s.dialogs.some((d) => d.id === dialog.id)) S.s.dialogs.push(dialog);
    }
    setTimeout(() => { if (S.banner === "Reconnected.") { S.banner = ""; update(); } }, 3000);
    if (S.view === "session" && S.s && (detail || link.attached === null)) loadSession(S.s.id);
    else if (S.view === "list") loadList();
    else if (S.s) refreshState();
  }
  update();
}

// --- the session's events ----------------------------------------------------------------

function onEvent(event) {
  const s = S.s;
  if (!s) return;
  switch (event.type) {
    case "agent_start":
      s.running = true;
      break;
    case "agent_end":
      // A message the file could not take never ends on its own: the run's end says so.
      s.t.live = null;
      for (const message of event.messages || []) {
        if (message.role === "assistant" && message.stopReason === "error") mergeMessage(s.t, message);
      }
      break;
    case "agent_settled":
      s.running = false;
      refreshState();
      s.refreshPanels?.();
      break;
    case "extension_ui_request":
      if (event.method === "notify") s.notes = [...s.notes.slice(-4), event.message || event.title];
      else if (!s.dialogs.some((d) => d.id === event.id)) s.dialogs.push(event);
      break;
    case "extension_ui_resolved":
      s.dialogs = s.dialogs.filter((d) => d.id !== event.id);
      break;
    case "session_info_changed":
      s.name = event.name;
      break;
    case "thinking_level_changed":
      s.thinking = event.level;
      break;
    case "model_changed":
      s.model = `${event.provider}/${event.modelId}`;
      break;
    case "permission_mode_changed":
      s.mode = event.mode;
      break;
    case "auto_retry_start":
      s.notes = [...s.notes.slice(-4), `Retrying (${event.attempt}/${event.maxAttempts}): ${event.errorMessage}`];
      break;
    default:
      if (event.sessionId && s.id !== event.sessionId) link.attached = s.id = event.sessionId; // a fork or clone
      if (!applyEvent(s.t, event)) return;
  }
  if (event.type === "message_end" && event.message?.role === "assistant") {
    link.ask("get_session_stats").then((stats) => { if (S.s === s) { s.stats = stats; update(); } }, () => {});
    if (event.message.stopReason === "error") s.announce = `The run failed: ${event.message.errorMessage}`;
    else s.announce = textOf(event.message);
  }
  update();
}

async function refreshState() {
  const s = S.s;
  if (!s) return;
  try {
    const [state, stats] = await Promise.all([link.ask("get_state"), link.ask("get_session_stats")]);
    if (S.s !== s) return; // another view by now
    s.id = state.sessionId;
    link.attached = s.id; // a fork or clone switched the session's file, and its id
    s.name = state.sessionName;
    s.model = state.model ? `${state.model.provider}/${state.model.id}` : "";
    s.thinking = state.thinkingLevel;
    s.mode = state.permissionMode;
    s.running = state.isStreaming || state.isCompacting;
    s.stats = stats;
    if (location.hash !== `#/s/${s.id}`) history.replaceState(null, "", `#/s/${s.id}`);
  } catch (error) {
    s.notes = [...s.notes, String(error.message)];
  }
  update();
}

// --- loading the views -------------------------------------------------------------------

async function loadList() {
  S.view = "list";
  try {
    const data = await link.ask("list_sessions");
    performance.mark("forged:listed");
    S.sessions = data.sessions;
    S.stored = data.stored;
    S.cwd = data.cwd;
  } catch (error) {
    S.problem = error.message;
  }
  update();
}

async function loadSession(id) {
  S.view = "session";
  S.s = {
    id, name: null, model: "", thinking: "", mode: "", running: false, stats: null,
    t: newTranscript(), dialogs: [], notes: [], problem: "",
    checkpoints: [], diffs: {}, restoring: null, restored: "", tree: { tree: [], leafId: null },
    refreshPanels: null, // once attached: nothing is asked of a session before
  };
  const s = S.s;
  update();
  try {
    await link.detach();
    if (S.s !== s) return; // left meanwhile
    const attached = await link.attach(id);
    if (S.s !== s) return void link.detach();
    for (const dialog of attached.dialogs || []) {
      if (!s.dialogs.some((d) => d.id === dialog.id)) s.dialogs.push(dialog);
    }
    if (attached.queue) applyEvent(s.t, attached.queue);
    const [messages] = await Promise.all([link.ask("get_messages"), refreshState()]);
    if (S.s !== s) return;
    // Events that came meanwhile are kept: a message is not drawn twice (`mergeMessage`).
    const seen = s.t.messages;
    s.t.messages = messages.messages;
    for (const message of seen) mergeMessage(s.t, message);
    s.refreshPanels = () => loadPanels(s);
    s.refreshPanels();
    if (may("control")) {
      const [models, levels] = await Promise.all([
        link.ask("get_available_models"), link.ask("get_available_thinking_levels")]);
      S.models = models.models;
      S.levels = levels.levels || [];
    }
  } catch (error) {
    s.problem = error.message;
  }
  update();
}

function route() {
  if (location.hash && !location.hash.startsWith("#/")) return; // "#main": the skip link
  const match = location.hash.match(/^#\/s\/([\w-]+)$/);
  if (match) {
    if (!S.s || S.s.id !== match[1] || S.view !== "session") loadSession(match[1]);
  } else {
    S.view = "list";
    S.s = null;
    link.detach().then(loadList);
  }
}

// --- the views ---------------------------------------------------------------------------

// A session's state in words, coloured by its class; `live`: a status region (the open one).
function State({ waiting, running, live }) {
  const [words, kind] = waiting ? ["waiting for you", "waiting"] : running ? ["running", "running"]
    : ["idle", "idle"];
  return html`<span class=${`state state-${kind}`} role=${live ? "status" : undefined}>${words}</span>`;
}

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return new Date(ms).toLocaleString();
}

const dollars = (cost) => `$${(cost || 0).toFixed(4)}`;


function SessionList() {
  const newSession = (e) => {
    e.preventDefault();
    const cwd = new FormData(e.target).get("cwd");
    act(async () => {
      await link.ask("new_session", cwd ? { cwd } : {});
      link.attached = "opening"; // its first command opens it
      const state = await link.ask("get_state");
      link.attached = state.sessionId;
      location.hash = `#/s/${state.sessionId}`;
    }, null);
  };
  return html`<main id="main">
    <h1>Sessions</h1>
    ${S.problem ? html`<p class="error" role="alert">${S.problem}</p>` : ""}
    ${S.sessions.length === 0 ? html`<p class="note">No session is live.</p>` : ""}
    <ul class="sessions">
      ${S.sessions.map((info) => html`<li class="session-item">
        <div class="session-line">
          <a href=${`#/s/${info.sessionId}`} class="session-name">${info.sessionName || `Session ${info.sessionId.slice(0, 8)}`}</a>
          <${State} waiting=${info.waiting} running=${info.state === "streaming"} />
        </div>
        <div class="folder">${info.cwd}</div>
        <div class="meta"><span class="model">${info.provider ? `${info.provider}/${info.modelId}` : "no model"}</span>
          ${" · "}<span class="cost">${dollars(info.cost)}</span>${" · "}<span class="when">${ago(info.lastActivity)}</span></div>
      </li>`)}
    </ul>
    ${S.stored.length ? html`<h2>Stored in ${S.cwd}</h2>
      <ul class="stored">${S.stored.slice(-20).reverse().map((stored) => html`<li>
        <a href=${`#/s/${stored.sessionId}`}>${stored.sessionId.slice(0, 8)}</a> <span class="when">${new Date(stored.modified).toLocaleString()}</span>
      </li>`)}</ul>` : ""}
    ${may("control") ? html`<form class="new" onSubmit=${newSession}>
      <h2>New session</h2>
      <label for="cwd">Folder</label>
      <input id="cwd" name="cwd" value=${S.cwd} autocomplete="off" />
      <button type="submit">New session</button>
    </form>` : ""}
    <p><button type="button" onClick=${loadList}>Refresh</button></p>
    ${"PushManager" in window && "serviceWorker" in navigator ? html`<${Notifications} />` : ""}
  </main>`;
}

// Web Push to this browser: "a run needs you" while the page is closed (docs/web.md).
function Notifications() {
  const on = () => act(async () => {
    S.pushed = "";
    S.problem = "";
    if (await Notification.requestPermission() !== "granted") {
      throw new Error("Notifications are blocked for this page: allow them in the browser's site settings");
    }
    const registration = await Promise.race([navigator.serviceWorker.ready, new Promise((_, reject) =>
      setTimeout(() => reject(new Error("This page's service worker did not start: reload the page")), 10_000))]);
    const { publicKey } = await link.ask("get_push_key");
    const key = Uint8Array.from(atob(publicKey.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
    let subscription;
    S.pushed = "Asking this browser's push service…";
    update();
    try {
      // A browser that reaches no push service may never answer: 10 s, then say so.
      const silence = new Promise((_, reject) => setTimeout(() => reject(new Error("no answer in 10 s")), 10_000));
      subscription = await Promise.race([
        registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key }), silence]);
    } catch (error) {
      S.pushed = "";
      throw new Error(`This browser could not subscribe to its push service: ${error.message}`);
    }
    await link.ask("push_subscribe", { subscription: subscription.toJSON() });
    S.pushed = "Notifications are on for this browser.";
  }, null);
  return html`<section aria-labelledby="notify-heading">
    <h2 id="notify-heading">Notifications</h2>
    <p>A push to this browser when a run needs you or ends, while the page is closed.</p>
    <button type="button" onClick=${on}>Notify me on this device</button>
    <p role="status">${S.pushed || ""}</p>
  </section>`;
}

function Dialog({ dialog }) {
  const s = S.s;
  const answer = (fields) => act(async () => {
    link.send({ type: "extension_ui_response", id: dialog.id, ...fields }); // no response comes
    s.dialogs = s.dialogs.filter((d) => d.id !== dialog.id);
  });
  const titleId = `dialog-${dialog.id}`;
  let controls;
  if (!may("approve")) controls = html`<p class="note">Waits for a device that may answer.</p>`;
  else if (dialog.method === "select") {
    controls = html`<div class="options">${(dialog.options || []).map((option) => html`
      <button type="button" onClick=${() => answer({ value: option })}>${option}</button>`)}</div>`;
  } else if (dialog.method === "confirm") {
    controls = html`<div class="options">
      <button type="button" onClick=${() => answer({ confirmed: true })}>Yes</button>
      <button type="button" onClick=${() => answer({ confirmed: false })}>No</button></div>`;
  } else {
    const submit = (e) => {
      e.preventDefault();
      answer({ value: new FormData(e.target).get("value") });
    };
    controls = html`<form onSubmit=${submit}>
      <label for=${`${titleId}-value`}>Answer</label>
      <input id=${`${titleId}-value`} name="value" placeholder=${dialog.placeholder || ""} />
      <button type="submit">Answer</button>
      <button type="button" onClick=${() => answer({ cancelled: true })}>Cancel</button></form>`;
  }
  return html`<section role="group" class="dialog" aria-labelledby=${titleId}>
    <h2 id=${titleId}>${dialog.title || "A question"}</h2>
    ${dialog.message ? html`<p>${dialog.message}</p>` : ""}
    ${controls}
  </section>`;
}

function Composer() {
  const s = S.s;
  const send = (type, extra = {}) => (e) => {
    e?.preventDefault();
    const box = document.getElementById("prompt");
    const message = box.value.trim();
    if (!message) return;
    box.value = ""; // at once: what is typed next is not the sent message's to clear
    act(async () => {
      try {
        await link.ask(type, { message, ...extra });
      } catch (error) {
        if (!box.value) box.value = message; // not sent: given back
        throw error;
      }
    });
  };
  const keys = (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send("prompt", s.running ? { streamingBehavior: "followUp" } : {})(e);
  };
  return html`<form class="composer" onSubmit=${send("prompt", s.running ? { streamingBehavior: "followUp" } : {})}>
    <label for="prompt" class="visually-hidden">Prompt</label>
    <textarea id="prompt" rows="3" placeholder="Ask, or tell it what to do (Ctrl+Enter sends)" onKeyDown=${keys}></textarea>
    <div class="actions">
      <button type="submit">Send</button>
      <button type="button" onClick=${send("steer")} disabled=${!s.running}>Steer</button>
      <button type="button" onClick=${send("follow_up")} disabled=${!s.running}>Follow up</button>
      <button type="button" class="danger" disabled=${!s.running}
        onClick=${() => act(() => link.ask("abort"))}>Abort</button>
    </div>
  </form>`;
}

function Settings() {
  const s = S.s;
  const choose = (type, field) => (e) => act(() => link.ask(type, field(e.target.value)));
  return html`<div class="settings">
    ${may("control") ? html`
      <label>Model <select value=${s.model} onChange=${choose("set_model", (v) => { const [p, ...m] = v.split("/"); return { provider: p, modelId: m.join("/") }; })}>
        ${S.models.map((m) => html`<option value=${`${m.provider}/${m.id}`}>${m.provider}/${m.id}</option>`)}
      </select></label>
      <label>Thinking <select value=${s.thinking} onChange=${choose("set_thinking_level", (level) => ({ level }))}>
        ${(S.levels.length ? S.levels : [s.thinking]).map((l) => html`<option value=${l}>${l}</option>`)}
      </select></label>` : html`<span>Model ${s.model || "none"}</span> <span>Thinking ${s.thinking}</span>`}
    ${may("owner") ? html`<label>Permission mode <select value=${s.mode} onChange=${choose("set_permission_mode", (mode) => ({ mode }))}>
        ${PERMISSION_MODES.map((m) => html`<option value=${m}>${m}</option>`)}
      </select></label>` : html`<span>Permission mode ${s.mode}</span>`}
  </div>`;
}

function SessionView() {
  const s = S.s;
  const t = s.t;
  const stats = s.stats;
  const rename = () => {
    const name = prompt("Name this session", s.name || "");
    if (name) act(() => link.ask("set_session_name", { name }));
  };
  const remove = () => {
    if (confirm("Delete this session's file?")) {
      act(async () => {
        await link.ask("delete_session", { sessionId: s.id });
        location.hash = "#/";
      });
    }
  };
  const queued = [...t.queue.steering.map((m) => ["steer", m]), ...t.queue.followUp.map((m) => ["follow-up", m])];
  return html`<main id="main" class="session">
    <div class="session-head">
      <h1>${s.name || `Session ${s.id.slice(0, 8)}`}</h1>
      <p class="state-line"><${State} waiting=${s.dialogs.length > 0} running=${s.running} live=${true} />
        ${stats ? html` <span class="usage">${stats.tokens.total.toLocaleString()} tokens · ${dollars(stats.cost)}</span>` : ""}</p>
      ${may("control") ? html`<div class="session-actions">
        <button type="button" onClick=${rename}>Rename</button>
        <button type="button" onClick=${() => act(() => link.ask("clone").then(refreshState))}>Fork</button>
        ${may("owner") ? html`<button type="button" class="danger" onClick=${remove}>Delete</button>` : ""}
      </div>` : ""}
      <${Settings} />
    </div>
    ${s.problem ? html`<p class="error" role="alert">${s.problem}</p>` : ""}
    <div class="columns">
      <section class="conversation" aria-label="Transcript">
        <${Transcript} t=${t} />
        <p class="visually-hidden" aria-live="polite">${s.announce || ""}</p>
        ${s.dialogs.map((dialog) => html`<${Dialog} dialog=${dialog} />`)}
        ${s.notes.length ? html`<ul class="notes" aria-label="Notices">${s.notes.map((n) => html`<li>${n}</li>`)}</ul>` : ""}
        ${queued.length ? html`<section aria-label="Queue" class="queue"><h2>Queued</h2><ol>${queued.map(([kind, m]) => html`<li><span class="kind">${kind}</span> ${m}</li>`)}</ol></section>` : ""}
        ${may("control") ? html`<${Composer} />` : html`<p class="note">This device (${S.device}) may watch only: it has the ${S.role} role.</p>`}
      </section>
      <aside class="panels">
        <${Checkpoints} s=${s} />
        <${Tree} s=${s} />
      </aside>
    </div>
  </main>`;
}

function Page() {
  let body;
  if (S.view === "unpaired") {
    body = html`<main id="main"><h1>Pair this browser</h1>
      <p>This browser is not signed in to forged (${S.problem}). On the daemon's machine, run
      <code>forged web</code> (on that machine's own browser) or <code>forged pair --name phone --role control</code>,
      and open the link it prints here.</p></main>`;
  } else if (S.view === "connecting") {
    body = html`<main id="main"><h1>forged</h1><p role="status">Connecting…</p></main>`;
  } else if (S.view === "list") body = html`<${SessionList} />`;
  else body = html`<${SessionView} />`;
  return html`<header class="top">
      <a href="#/" class="brand">forged</a>
      ${S.device ? html`<span class="who">${S.device} · ${S.role}</span>` : ""}
    </header>
    <div class="banner" role="status" aria-live="polite">${S.banner}</div>
    ${body}`;
}


async function start() {
  try {
    await link.open();
  } catch (error) {
    if (error instanceof NotPaired) {
      S.view = "unpaired";
      S.problem = error.message;
      update();
      return;
    }
    S.banner = "Cannot reach the daemon: reconnecting…";
    update();
    link.ws = null;
    await link.reconnect();
    if (S.view === "unpaired") return;
  }
  S.role = link.role;
  S.device = link.device;
  window.addEventListener("hashchange", route);
  route();
  setInterval(() => { if (S.view === "list" && link.ws) loadList(); }, 5000);
  if ("serviceWorker" in navigator) navigator.serviceWorker.register("/sw.js").catch(() => {});
}

start();
