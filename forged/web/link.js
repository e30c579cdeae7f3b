// The page's one connection to the daemon: a WebSocket opened with a single-use ticket,
// which the browser's cookie buys at its own ticket path (docs/remote.md). Commands are
// answered by id; events of the attached session come in `seq` order. When the connection
// drops (a phone asleep, a network change) it is opened again, and the session attached
// again from the last `seq` seen: nothing missed, nothing twice.

export class NotPaired extends Error {}

const RETRY_MS = [250, 500, 1000, 2000, 4000];
const OPEN_MS = 10_000; // a ticket or a handshake unanswered this long is tried again
// A connection quiet this long is asked something; unanswered this long after, it is taken
// for dead (a phone that slept leaves its TCP connection open on one side only, and the
// browser can take minutes to notice).
const QUIET_MS = 25_000;
const ANSWER_MS = 10_000;
const UNATTACHED = new Set(["list_sessions", "attach", "detach", "new_session", "delete_session",
  "get_push_key", "push_subscribe", "push_unsubscribe"]);

export class Link {
  constructor({ onEvent, onStatus }) {
    this.onEvent = onEvent;
    this.onStatus = onStatus; // "open" | "away" | "back" | "unpaired"
    this.ws = null;
    this.pending = new Map();
    this.nextId = 1;
    this.attached = null; // the session id, while attached
    this.lastSeq = 0;
    this.role = null;
    this.device = null;
    this.attempt = 0;
    this.heard = 0;
    setInterval(() => this.check(), QUIET_MS);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) { // awake again: is the connection?
        this.heard = 0;
        this.check();
      }
    });
  }

  // Ask the daemon something when nothing was heard for a while; close the connection
  // (and so reconnect) when it does not answer.
  check() {
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN || Date.now() - this.heard < QUIET_MS) return;
    const dead = setTimeout(() => {
      if (this.ws !== ws) return;
      ws.close();
      this.lost(ws);
    }, ANSWER_MS);
    this.call("list_sessions").then(() => clearTimeout(dead), () => clearTimeout(dead));
  }

  async ticket() {
    const path = localStorage.getItem("forged.ticketPath");
    if (!path) throw new NotPaired("this browser is not paired");
    const answer = await fetch(path, { method: "POST", credentials: "same-origin",
      signal: AbortSignal.timeout(OPEN_MS) });
    const data = await answer.json().catch(() => ({}));
    if (answer.status === 401 || answer.status === 403) throw new NotPaired(data.error || "refused");
    if (!answer.ok) throw new Error(data.error || `HTTP ${answer.status}`);
    return data;
  }

  async open() {
    const { ticket, role, device } = await this.ticket();
    performance.mark("forged:ticket");
    this.role = role;
    this.device = device;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/?ticket=${encodeURIComponent(ticket)}`);
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error("the daemon refused the connection"));
      setTimeout(() => {
        if (ws.readyState !== WebSocket.OPEN) {
          ws.close();
          reject(new Error("no answer from the daemon"));
        }
      }, OPEN_MS);
    });
    performance.mark("forged:open");
    ws.onmessage = (message) => this.receive(JSON.parse(message.data));
    ws.onclose = () => this.lost(ws);
    this.ws = ws;
    this.heard = Date.now();
    this.attempt = 0;
  }

  receive(message) {
    this.heard = Date.now();
    if (message.type === "response") {
      const waiting = this.pending.get(message.id);
      if (waiting) {
        this.pending.delete(message.id);
        waiting.resolve(message);
      }
      return;
    }
    if (typeof message.seq === "number") {
      if (message.seq <= this.lastSeq) return; // given again after a reconnect
      this.lastSeq = message.seq;
    }
    this.onEvent(message);
  }

  // The response to a command (`success` true or false); rejects when not connected.
  call(type, fields = {}) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error("not connected: reconnecting"));
    }
    const id = `w${this.nextId++}`;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ id, type, ...fields }));
    });
  }

  // Like `call`, but the response's data, or an Error with the daemon's reason. A
  // session's command is not sent unattached: the daemon would open a session for it.
  async ask(type, fields = {}) {
    if (this.attached === null && !UNATTACHED.has(type)) throw new Error(`${type}: no session is open`);
    const answer = await this.call(type, fields);
    if (!answer.success) throw new Error(answer.error || `${type} failed`);
    return answer.data;
  }

  async attach(sessionId) {
    this.lastSeq = Infinity; // nothing of the session left before: its events from here on
    const data = await this.ask("attach", { sessionId });
    this.attached = data.sessionId;
    // A message that streams is given from its start: `replayed` events up to `seq`.
    this.lastSeq = data.seq - data.replayed;
    this.loadId = data.loadId;
    return data;
  }

  // A message no response answers (``extension_ui_response``); false when not connected.
  send(message) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }

  async detach() {
    if (this.attached === null) return;
    this.attached = null;
    this.lastSeq = Infinity; // the session left: none of its events from here
    await this.ask("detach").catch(() => {});
  }

  lost(ws) {
    if (ws !== this.ws) return;
    this.ws = null;
    for (const waiting of this.pending.values()) waiting.reject(new Error("the connection dropped"));
    this.pending.clear();
    this.onStatus("away");
    this.reconnect();
  }

  async reconnect() {
    for (;;) {
      const delay = RETRY_MS[Math.min(this.attempt++, RETRY_MS.length - 1)];
      await new Promise((resolve) => setTimeout(resolve, delay));
      try {
        await this.open();
      } catch (error) {
        if (error instanceof NotPaired) {
          this.onStatus("unpaired", error.message);
          return;
        }
        continue;
      }
      let reload = false;
      if (this.attached !== null) {
        try {
          const data = await this.ask("attach", { sessionId: this.attached, sinceSeq: this.lastSeq });
          // Events older than those kept were missed, or the session was loaded again
          // (unloaded while away: its seq counts afresh): read it whole.
          reload = data.missed || data.loadId !== this.loadId;
          this.dialogs = data.dialogs || [];
          if (reload) this.lastSeq = data.seq;
          this.loadId = data.loadId;
        } catch (error) {
          reload = true;
        }
      }
      this.onStatus("back", reload);
      return;
    }
  }
}
