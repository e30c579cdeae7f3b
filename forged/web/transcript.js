// A session's conversation: the messages read with get_messages, then kept up to date by
// the session's events (docs/protocol.md, Events), and drawn as the transcript.

import { html } from "./preact-htm.js";
import { renderMarkdown } from "./markdown.js";

export function newTranscript() {
  return { messages: [], live: null, tools: {}, queue: { steering: [], followUp: [] } };
}

function sameMessage(a, b) {
  if (a.role !== b.role) return false;
  if (a.role === "toolResult") return a.toolCallId === b.toolCallId;
  return a.timestamp === b.timestamp && a.timestamp !== undefined;
}

// `message` in the transcript once: in place of the same one, else at the end.
export function mergeMessage(t, message) {
  const at = t.messages.findIndex((m) => sameMessage(m, message));
  if (at >= 0) t.messages[at] = message;
  else t.messages.push(message);
}

// `event` applied to `t`; true when it changed what the transcript shows.
export function applyEvent(t, event) {
  switch (event.type) {
    case "message_start":
      if (event.message.role === "assistant") t.live = { ...event.message, content: [] };
      return true;
    case "message_update": {
      const live = t.live;
      const e = event.assistantMessageEvent;
      if (!live || !e) return false;
      const i = e.contentIndex;
      if (e.type === "text_start") live.content[i] = { type: "text", text: "" };
      else if (e.type === "thinking_start") live.content[i] = { type: "thinking", thinking: "" };
      else if (e.type === "text_delta" && live.content[i]) live.content[i].text += e.delta;
      else if (e.type === "thinking_delta" && live.content[i]) live.content[i].thinking += e.delta;
      else if (e.type === "text_end") live.content[i] = { type: "text", text: e.content };
      else if (e.type === "thinking_end") live.content[i] = { type: "thinking", thinking: e.content };
      else if (e.type === "toolcall_start") {
        live.content[i] = { type: "toolCall", id: e.id, name: e.toolName, arguments: {}, partial: "" };
      } else if (e.type === "toolcall_delta" && live.content[i]) live.content[i].partial += e.delta;
      else if (e.type === "toolcall_end") live.content[i] = e.toolCall;
      if (event.usage) live.usage = event.usage;
      return true;
    }
    case "message_end":
      if (event.message.role === "assistant") t.live = null;
      mergeMessage(t, event.message);
      return true;
    case "tool_execution_start":
      t.tools[event.toolCallId] = { args: event.args, running: true };
      return true;
    case "tool_execution_update":
      t.tools[event.toolCallId] = { args: event.args, running: true, partial: event.partialResult };
      return true;
    case "tool_execution_end":
      t.tools[event.toolCallId] = { running: false, result: event.result, isError: event.isError };
      return true;
    case "queue_update":
      t.queue = { steering: event.steering || [], followUp: event.followUp || [] };
      return true;
    default:
      return false;
  }
}

export function textOf(message) {
  return contentText(message.content);
}

function contentText(content) {
  if (typeof content === "string") return content;
  return (content || []).filter((b) => b.type === "text").map((b) => b.text).join("\n");
}

function Markdown({ text }) {
  return html`<div class="markdown" dangerouslySetInnerHTML=${{ __html: renderMarkdown(text) }}></div>`;
}

// An edit's arguments as diff lines: what went, then what came.
function editDiff(args) {
  const edits = Array.isArray(args.edits) ? args.edits : [{ oldText: args.oldText, newText: args.newText }];
  const lines = [];
  for (const edit of edits) {
    for (const line of String(edit.oldText ?? "").split("\n")) lines.push(["del", `- ${line}`]);
    for (const line of String(edit.newText ?? "").split("\n")) lines.push(["add", `+ ${line}`]);
  }
  return lines;
}

export function Diff({ text, lines }) {
  const rows = lines || String(text).split("\n").map((line) => [
    line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del"
        : line.startsWith("@@") ? "hunk" : "", line]);
  return html`<pre class="diff">${rows.map(([kind, line]) => html`<span class=${kind}>${line}\n</span>`)}</pre>`;
}

function ToolCall({ call, outcome, running }) {
  const args = call.arguments || {};
  const path = args.path || args.file_path;
  let shown;
  if (call.name === "bash") shown = html`<pre class="command">$ ${args.command}</pre>`;
  else if (call.name === "edit" && path) shown = html`<${Diff} lines=${editDiff(args)} />`;
  else if (call.name === "write" && path) shown = html`<${Diff} lines=${String(args.content ?? "").split("\n").map((l) => ["add", `+ ${l}`])} />`;
  else shown = html`<pre class="args">${call.partial || JSON.stringify(args, null, 2)}</pre>`;
  const output = outcome ? contentText(outcome.content) : "";
  const state = running ? "running" : outcome ? (outcome.isError ? "failed" : "done") : "asked";
  return html`<section class="tool ${state}" aria-label=${`Tool ${call.name}`}>
    <div class="tool-head"><strong>${call.name}</strong>${path ? html` <code>${path}</code>` : ""}
      <span class="tool-state">${state}</span></div>
    ${shown}
    ${output ? html`<details open=${output.length < 2000}><summary>Output</summary><pre class="output">${output}</pre></details>` : ""}
  </section>`;
}

function Assistant({ message, t, live }) {
  const results = t.results;
  return html`<article class="message assistant" aria-label="Assistant">
    ${(message.content || []).map((block) => {
      if (!block) return "";
      if (block.type === "text") return html`<${Markdown} text=${block.text} />`;
      if (block.type === "thinking") {
        return html`<details class="thinking"><summary>Thinking</summary><p>${block.thinking}</p></details>`;
      }
      if (block.type === "toolCall") {
        const execution = t.tools[block.id];
        const outcome = results.get(block.id) || (execution && !execution.running ? execution.result : null);
        return html`<${ToolCall} call=${block} outcome=${outcome && { ...outcome, isError: outcome.isError ?? execution?.isError }}
          running=${execution?.running} />`;
      }
      return "";
    })}
    ${message.stopReason === "error" ? html`<p class="error">The run failed: ${message.errorMessage}</p>` : ""}
    ${message.stopReason === "aborted" ? html`<p class="note">Aborted.</p>` : ""}
    ${live ? html`<span class="cursor" aria-hidden="true">▍</span>` : ""}
  </article>`;
}

function Message({ message, t }) {
  switch (message.role) {
    case "user":
      return html`<article class="message user" aria-label="You"><${Markdown} text=${contentText(message.content)} /></article>`;
    case "assistant":
      return html`<${Assistant} message=${message} t=${t} />`;
    case "bashExecution":
      return html`<article class="message bash" aria-label="Command"><pre class="command">$ ${message.command}</pre>
        <pre class="output">${message.output}</pre></article>`;
    case "compactionSummary":
      return html`<p class="note">Compacted: ${message.summary}</p>`;
    case "branchSummary":
      return html`<p class="note">Branch summary: ${message.summary}</p>`;
    default:
      return "";
  }
}

export function Transcript({ t }) {
  t.results = new Map(t.messages.filter((m) => m.role === "toolResult").map((m) => [m.toolCallId, m]));
  return html`<div class="transcript">
    ${t.messages.length === 0 && !t.live ? html`<p class="note">Nothing said yet.</p>` : ""}
    ${t.messages.map((message) => html`<${Message} message=${message} t=${t} />`)}
    <div class="live" aria-busy=${t.live ? "true" : "false"}>
      ${t.live ? html`<${Assistant} message=${t.live} t=${t} live=${true} />` : ""}
    </div>
  </div>`;
}
