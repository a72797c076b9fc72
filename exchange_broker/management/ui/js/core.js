/* Core of the management UI: API calls with HTTP Basic credentials kept in sessionStorage,
   building elements (text only, never HTML strings from the API), messages, the hash router and
   the page's periodic refresh. Every other script adds pages to the EB namespace. */
"use strict";
const EB = (window.EB = {});
const AUTH_KEY = "exchange-broker.auth";
const USER_KEY = "exchange-broker.user";

EB.ApiError = class extends Error {
  constructor(status, reason) { super(reason); this.status = status; }
};

EB.encodeBasic = (user, password) => {
  const bytes = new TextEncoder().encode(user + ":" + password);
  let bin = "";
  bytes.forEach((b) => { bin += String.fromCharCode(b); });
  return btoa(bin);
};
EB.auth = () => sessionStorage.getItem(AUTH_KEY);
EB.user = () => JSON.parse(sessionStorage.getItem(USER_KEY) || "null");
EB.setLogin = (auth, user) => {
  sessionStorage.setItem(AUTH_KEY, auth);
  sessionStorage.setItem(USER_KEY, JSON.stringify(user));
};
/* Log in with credentials ("Basic" ones, or "Bearer <token>"): /api/whoami decides (user, tags). */
EB.logIn = async (auth) => {
  let me;
  try {
    me = await EB.api("GET", "/api/whoami", undefined, auth);
  } catch (err) {
    throw new Error(err.status === 401 ? "Login failed: " + err.message : err.message);
  }
  const tags = Array.isArray(me.tags) ? me.tags : String(me.tags || "").split(",").filter(Boolean);
  EB.setLogin(auth, { name: me.name, tags });
};
EB.clearLogin = () => { sessionStorage.removeItem(AUTH_KEY); sessionStorage.removeItem(USER_KEY); };
EB.isAdmin = () => { const u = EB.user(); return !!u && u.tags.includes("administrator"); };

/* One API call: the parsed JSON answer, null for 204; an EB.ApiError with the API's reason otherwise. */
EB.api = async (method, path, body, auth, extraHeaders) => {
  // X-Requested-With: the API then leaves out its Basic challenge (no browser login dialog)
  // a single sign-on login keeps "Bearer <token>"; a password login the Basic credentials ("-": none)
  const a = auth || EB.auth() || "";
  const headers = { Authorization: a.startsWith("Bearer ") ? a : "Basic " + a, "X-Requested-With": "XMLHttpRequest",
    ...(extraHeaders || {}) };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path.replace(/^\//, ""), init);  // relative to the page: works under a path prefix
  } catch (err) {
    throw new EB.ApiError(0, "The broker cannot be reached (" + err.message + ")");
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (err) { data = text; }
  }
  if (!resp.ok) {
    const reason = data && typeof data === "object"
      ? (typeof data.reason === "string" ? data.reason : JSON.stringify(data.reason || data.error))
      : (text || resp.statusText);
    const error = new EB.ApiError(resp.status, reason || "HTTP " + resp.status);
    // a login that stopped working (password changed, user deleted): back to the login form
    if (resp.status === 401 && !auth && data && data.error === "not_authorized") EB.loggedOut(error.message);
    throw error;
  }
  return data;
};
EB.get = (path) => EB.api("GET", path);

/* Path segments are percent-encoded as the API expects (the vhost "/" is %2F). */
EB.enc = (s) => encodeURIComponent(s);
EB.path = (...parts) => parts.map((p, i) => (i === 0 ? p : EB.enc(p))).join("/");

/* h("a", {href: "#x", class: "c", onclick: fn}, "text", child): an element; strings become text. */
EB.h = (tag, attrs, ...children) => {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  EB.append(el, children);
  return el;
};
EB.append = (el, children) => {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
};
EB.clear = (el) => { while (el.firstChild) el.removeChild(el.firstChild); return el; };
EB.$ = (sel, root) => (root || document).querySelector(sel);

/* Messages: errors stay until dismissed, confirmations fade after a few seconds. */
EB.flash = (text, kind) => {
  const box = EB.$("#messages");
  const msg = EB.h("div", { class: "msg " + (kind || "error") }, EB.h("span", {}, text),
    EB.h("button", { type: "button", "aria-label": "Dismiss", onclick: () => msg.remove() }, "×"));
  box.append(msg);
  while (box.children.length > 4) box.firstChild.remove();
  if (kind === "ok") setTimeout(() => msg.remove(), 6000);
  return msg;
};
EB.ok = (text) => EB.flash(text, "ok");
EB.clearMessages = () => EB.clear(EB.$("#messages"));
EB.fail = (err) => EB.flash(err instanceof EB.ApiError || err instanceof Error ? err.message : String(err));

/* Formatting */
EB.num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString("en-US"));
EB.rate = (n) => (n === undefined || n === null ? "" : Number(n).toFixed(1) + "/s");
EB.bytes = (n) => {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
};
EB.duration = (ms) => {
  const s = Math.floor(ms / 1000), d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  return (d ? d + "d " : "") + (d || hh ? hh + "h " : "") + mm + "m " + (s % 60) + "s";
};
EB.pick = (obj, path) => path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
EB.json = (v) => JSON.stringify(v === undefined ? null : v);

/* A table: columns [{label, key | value(row), num, render(row) -> node|text, sort}]. */
EB.table = (columns, rows, opts) => {
  opts = opts || {};
  if (!rows || rows.length === 0) return EB.h("p", { class: "empty" }, opts.empty || "Nothing here.");
  const head = EB.h("tr", {}, columns.map((c) => {
    const th = EB.h("th", { class: (c.num ? "num " : "") + (c.narrow ? "hide-narrow" : ""), scope: "col" });
    if (opts.onSort && c.sort) {
      const active = opts.sort === c.sort;
      if (active) th.setAttribute("aria-sort", opts.reverse ? "descending" : "ascending");
      th.append(EB.h("button", { type: "button", class: "sort", onclick: () => opts.onSort(c.sort) },
        c.label + (active ? (opts.reverse ? " ▼" : " ▲") : "")));
    } else th.append(c.label);
    return th;
  }));
  const body = rows.map((row) => EB.h("tr", { dataset: opts.rowData ? opts.rowData(row) : undefined },
    columns.map((c) => {
      const value = c.render ? c.render(row) : (c.value ? c.value(row) : EB.pick(row, c.key));
      const text = c.num && typeof value === "number" ? EB.num(value) : value;
      return EB.h("td", { class: (c.num ? "num " : "") + (c.narrow ? "hide-narrow" : "") }, text);
    })));
  return EB.h("div", { class: "table-wrap" }, EB.h("table", { class: opts.class }, EB.h("thead", {}, head),
    EB.h("tbody", {}, body)));
};
EB.kv = (pairs) => EB.h("table", { class: "kv" }, EB.h("tbody", {},
  pairs.filter((p) => p).map(([k, v]) => EB.h("tr", {}, EB.h("th", { scope: "row" }, k), EB.h("td", {}, v)))));
EB.section = (title, ...body) => EB.h("section", { class: "card" }, EB.h("h2", {}, title), body);
EB.stat = (label, value, id) => EB.h("div", { class: "stat", dataset: { stat: id || label } },
  EB.h("div", { class: "label" }, label), EB.h("div", { class: "value" }, value));
EB.link = (href, text) => EB.h("a", { href }, text);
EB.queueHref = (vhost, name) => "#/queues/" + EB.enc(vhost) + "/" + EB.enc(name);
EB.exchangeHref = (vhost, name) => "#/exchanges/" + EB.enc(vhost) + "/" + EB.enc(name || "amq.default");
EB.features = (o) => [o.durable ? "D" : null, o.auto_delete ? "AD" : null, o.exclusive ? "Excl" : null,
  o.internal ? "I" : null].filter(Boolean).map((f) => EB.h("span", { class: "tag", title: {
  D: "durable", AD: "auto-delete", Excl: "exclusive", I: "internal" }[f] }, f));

/* The vhost chosen in the header ("" = all) and API paths that honour it. */
EB.vhost = () => EB.$("#vhost-select").value;
EB.scoped = (base) => (EB.vhost() ? base + "/" + EB.enc(EB.vhost()) : base);

/* Router: "#/queues/%2F/q1" -> the handler registered for "queues" with ["/", "q1"]. */
const routes = {};
let timers = [];
let renderSeq = 0;
EB.route = (name, handler) => { routes[name] = handler; };
EB.every = (fn, ms) => {
  const seq = renderSeq;
  const id = setInterval(() => { if (seq === renderSeq && !document.hidden) fn(); }, ms || EB.refreshMs);
  timers.push(id);
};
EB.refreshMs = 5000;
EB.render = async () => {
  timers.forEach(clearInterval);
  timers = [];
  renderSeq += 1;
  const main = EB.$("#main");
  EB.clear(main);
  if (!EB.auth()) { EB.loginPage(main); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "").map(decodeURIComponent);
  const name = parts[0] || "overview";
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === name));
  const handler = routes[name];
  if (!handler) { main.append(EB.h("h1", {}, "Not found"), EB.h("p", {}, "No page " + location.hash)); return; }
  try {
    await handler(main, parts.slice(1));
  } catch (err) {
    main.append(EB.h("p", { class: "empty" }, "This page could not be shown."));
    EB.fail(err);
  }
};
EB.go = (hash) => { if (location.hash === hash) EB.render(); else location.hash = hash; };
EB.loggedOut = (reason) => {
  EB.clearLogin();
  if (reason) EB.flash(reason);
  EB.render();
};
