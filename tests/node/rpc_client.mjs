// Drives forged with the ancestor's own RpcClient (npm @earendil-works/pi-coding-agent),
// unchanged: it spawns `node <cliPath> --mode rpc ...`, so cliPath is a shim that runs forged.
// Usage: node rpc_client.mjs <rpc-client.js> <shim.mjs> <cwd> <script.json>
// Prints one JSON object with what the client saw.
const [clientPath, shim, cwd, script] = process.argv.slice(2);
const { RpcClient } = await import(clientPath);

const client = new RpcClient({
  cliPath: shim, cwd, provider: "scripted",
  args: ["--script", script, "--no-session"],
});
const events = [];
client.onEvent((event) => events.push(event.type));
await client.start();
const state = await client.getState();
const reply = await client.promptAndWait("Say hello", undefined, 30000);
const text = await client.getLastAssistantText();
const stats = await client.getSessionStats();
const bash = await client.bash("echo from-bash");
const levels = await client.getAvailableThinkingLevels();
await client.setThinkingLevel("low");
const after = await client.getState();
const messages = await client.getMessages();
await client.stop();
console.log(JSON.stringify({
  model: state.model?.id, streaming: state.isStreaming, text,
  events: [...new Set(events)], userMessages: stats.userMessages,
  bash: bash.output, levels, level: after.thinkingLevel,
  roles: messages.map((m) => m.role), settledLast: events.at(-1),
  replyTypes: reply.map((e) => e.type).slice(-2),
}));
