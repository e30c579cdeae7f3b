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
  // The daemon's answer, kept; the kept one when the daemon is out of reach or slow (3 s).
  const fresh = fetch(event.request).then((answer) => {
    if (answer.ok) {
      const copy = answer.clone();
      event.waitUntil(caches.open(SHELL).then((cache) => cache.put(event.request, copy)));
    }
    return answer;
  });
  const slow = new Promise((resolve) => setTimeout(resolve, 3000)).then(() => caches.match(event.request));
  event.respondWith(Promise.race([fresh.catch(() => caches.match(event.request)), slow.then(
    (kept) => kept || fresh)]));
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
  const url = event.notification.data?.url || "/";
  event.waitUntil(self.clients.matchAll({ type: "window" }).then((open) => {
    const page = open.find((client) => new URL(client.url).origin === location.origin);
    return page ? page.focus().then(() => page.navigate(url)) : self.clients.openWindow(url);
  }));
});
