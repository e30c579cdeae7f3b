// forged's service worker: the page's shell (its own files) kept for a start with no
// network, always asked of the daemon first; nothing else (the WebSocket, tickets, pairing)
// passes through a cache. A push ("a run needs you") is shown as a notification.

const SHELL = "forged-shell-v1";
const FILES = ["/", "/app.js", "/state.js", "/link.js", "/transcript.js", "/panels.js", "/markdown.js",
  "/preact-htm.js", "/app.css", "/icon.svg", "/manifest.webmanifest"];

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(SHELL).then((cache) => cache.addAll(FILES)).then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(caches.keys().then((keys) => Promise.all(
    keys.filter((key) => key !== SHELL).map((key) => caches.delete(key)))).then(() => self.clients.claim()));
});

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== location.origin || !FILES.includes(url.pathname)) return;
  event.respondWith(fetch(event.request).then((answer) => {
    const copy = answer.clone();
    caches.open(SHELL).then((cache) => cache.put(event.request, copy));
    return answer;
  }).catch(() => caches.match(event.request)));
});

self.addEventListener("push", (event) => {
  let data = {};
  try { data = event.data ? event.data.json() : {}; } catch (error) { data = { title: event.data.text() }; }
  event.waitUntil(self.registration.showNotification(data.title || "forged", {
    body: data.body || "", tag: data.sessionId || "forged", data: { url: data.sessionId ? `/#/s/${data.sessionId}` : "/" },
  }));
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(self.clients.openWindow(event.notification.data?.url || "/"));
});
