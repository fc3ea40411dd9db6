// Throttle's operator console: reads the admin API with the token typed into the login
// form and draws what it returns. No framework, no build step, no other origin.
//
// - The token lives in `token` below only (never in storage, a cookie or a URL); without
//   it nothing is requested at all.
// - Every URL is relative to the page's directory (`base`), so the console works behind
//   a path prefix (`ops.example/throttle/`).
// - Decisions per second are differences of successive `/metrics` scrapes:
//   `throttle_requests_total{route,status}` (429 limited, 403 blocked, the rest allowed)
//   and `throttle_decisions_total{scope,decision}` with `throttle_bans_total{scope}`.
(function () {
  "use strict";

  var REFRESH_MS = 2500;
  var SAMPLES = 48;
  var SVG = "http://www.w3.org/2000/svg";
  var base = location.pathname.replace(/[^/]*$/, "");

  var token = null;
  var generation = 0; // bumped on log in and out: late answers of an old session are dropped
  var timer = null;
  var ticks = 0;
  var previous = null; // {at, counters} of the last scrape
  var history = { route: {}, scope: {} }; // name -> [{allowed, limited, blocked}]

  function $(id) { return document.getElementById(id); }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) { td.className = cls; }
    row.appendChild(td);
    return td;
  }

  // A request to the admin API; rejects on a network error or a non-2xx answer
  // (`err.status` set), and logs out on 401.
  function api(method, path) {
    if (token === null) { return Promise.reject(new Error("not logged in")); }
    var gen = generation;
    return fetch(base + path, {
      method: method,
      headers: { "Authorization": "Bearer " + token },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer"
    }).then(function (r) {
      if (gen !== generation) { throw new Error("logged out"); }
      if (r.status === 401) {
        logout("The token was refused.");
        throw Object.assign(new Error("unauthorized"), { status: 401 });
      }
      if (!r.ok) {
        return r.text().then(function (t) {
          var detail = t;
          try { var j = JSON.parse(t); detail = j.detail || j.error || t; } catch (e) { /* text */ }
          throw Object.assign(new Error(r.status + ": " + detail), { status: r.status });
        });
      }
      return r.status === 204 ? null : r.text();
    }).then(function (t) {
      if (gen !== generation) { throw new Error("logged out"); }
      return t;
    });
  }

  function json(path) {
    return api("GET", path).then(function (t) { return JSON.parse(t); });
  }

  // ---- Prometheus text -------------------------------------------------------------

  // {"name|label=value,...": number} of the counters the charts use.
  function parseMetrics(text) {
    var out = {};
    var wanted = /^(throttle_requests_total|throttle_decisions_total|throttle_bans_total)\{([^}]*)\}\s+(\S+)/;
    text.split("\n").forEach(function (line) {
      var m = wanted.exec(line);
      if (!m) { return; }
      var labels = {};
      var re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
      var l;
      while ((l = re.exec(m[2])) !== null) { labels[l[1]] = l[2].replace(/\\(.)/g, "$1"); }
      var v = Number(m[3]);
      if (!isNaN(v)) { out[m[1] + "\u0000" + JSON.stringify(labels)] = { name: m[1], labels: labels, value: v }; }
    });
    return out;
  }

  function outcomeOf(series) {
    var l = series.labels;
    if (series.name === "throttle_requests_total") {
      return { group: "route", key: l.route, kind: l.status === "429" ? "limited" : l.status === "403" ? "blocked" : "allowed" };
    }
    if (series.name === "throttle_bans_total") {
      return { group: "scope", key: l.scope, kind: "blocked" };
    }
    var limited = l.decision === "rejected" || l.decision === "failed_closed" || l.decision === "shadow_rejected";
    return { group: "scope", key: l.scope, kind: limited ? "limited" : "allowed" };
  }

  // Adds one sample of rates per route and scope from two scrapes `secs` apart.
  function addRates(before, after, secs) {
    var rates = { route: {}, scope: {} };
    Object.keys(after).forEach(function (id) {
      var s = after[id];
      var o = outcomeOf(s);
      if (!o.key) { return; }
      var r = rates[o.group][o.key] || (rates[o.group][o.key] = { allowed: 0, limited: 0, blocked: 0 });
      var was = before[id] ? before[id].value : 0;
      var d = s.value - was;
      if (d > 0) { r[o.kind] += d / secs; }
    });
    ["route", "scope"].forEach(function (g) {
      Object.keys(rates[g]).forEach(function (k) {
        var h = history[g][k] || (history[g][k] = []);
        h.push(rates[g][k]);
        if (h.length > SAMPLES) { h.shift(); }
      });
    });
  }

  // ---- charts ----------------------------------------------------------------------

  function svg(tag, attrs) {
    var n = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (a) { n.setAttribute(a, attrs[a]); });
    return n;
  }

  function fmt(n) { return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2); }

  // One chart: three lines (allowed, limited, blocked) over the last SAMPLES refreshes.
  // `third` names the third line: "blocked" for routes, "new bans" for scopes.
  function chart(name, samples, third) {
    var w = 320, h = 110, pad = 4;
    var max = 1;
    samples.forEach(function (s) { max = Math.max(max, s.allowed, s.limited, s.blocked); });
    var figure = document.createElement("figure");
    figure.className = "chart";
    var last = samples[samples.length - 1] || { allowed: 0, limited: 0, blocked: 0 };
    figure.setAttribute("data-name", name);
    figure.setAttribute("data-last", ["allowed", "limited", "blocked"].map(function (k) { return k + "=" + fmt(last[k]); }).join(" "));
    figure.setAttribute("data-samples", String(samples.length));
    var pic = svg("svg", { viewBox: "0 0 " + w + " " + h, role: "img", "aria-label": name });
    pic.appendChild(svg("rect", { x: 0, y: 0, width: w, height: h, "class": "plot" }));
    ["allowed", "limited", "blocked"].forEach(function (kind) {
      var pts = samples.map(function (s, i) {
        var x = pad + (w - 2 * pad) * (samples.length === 1 ? 1 : i / (SAMPLES - 1));
        var y = h - pad - (h - 2 * pad) * (s[kind] / max);
        return x.toFixed(1) + "," + y.toFixed(1);
      });
      pic.appendChild(svg("polyline", { points: pts.join(" "), "class": "line " + kind }));
    });
    var top = svg("text", { x: w - pad, y: 14, "class": "scale", "text-anchor": "end" });
    top.textContent = fmt(max) + "/s";
    pic.appendChild(top);
    figure.appendChild(pic);
    var caption = document.createElement("figcaption");
    caption.textContent = name + ": " + fmt(last.allowed) + " allowed, " + fmt(last.limited) + " limited, " + fmt(last.blocked) + " " + third + " /s";
    figure.appendChild(caption);
    return figure;
  }

  function drawCharts() {
    [["route", "route-charts", "blocked"], ["scope", "scope-charts", "new bans"]].forEach(function (p) {
      var box = $(p[1]);
      clear(box);
      Object.keys(history[p[0]]).sort().forEach(function (name) {
        box.appendChild(chart(name, history[p[0]][name], p[2]));
      });
    });
  }

  function refreshMetrics() {
    return api("GET", "metrics").then(function (text) {
      var now = { at: Date.now(), counters: parseMetrics(text) };
      if (previous) {
        var secs = Math.max((now.at - previous.at) / 1000, 0.001);
        addRates(previous.counters, now.counters, secs);
        drawCharts();
      }
      previous = now;
    });
  }

  // ---- panels ----------------------------------------------------------------------

  function refreshHealth() {
    return json("readyz").catch(function (e) {
      return { ready: false, error: e.message };
    }).then(function (r) {
      if (token === null) { return; }
      var el = $("health");
      if (!r.ready) {
        el.textContent = "not ready" + (r.waiting ? " (waiting for " + r.waiting.join(", ") + ")" : r.error ? " (" + r.error + ")" : "");
        el.className = "health bad";
        return;
      }
      var store = r.store || {};
      var db = r.database || {};
      el.textContent = "store " + store.backend + (store.healthy ? " healthy" : " DOWN") +
        (store.instances ? " (" + store.instances + " instances)" : "") +
        ", database " + (!db.configured ? "not configured" : db.healthy ? "healthy" : "DOWN") +
        (r.instance_id ? " - " + r.instance_id : "");
      el.className = "health " + (r.degraded ? "bad" : "good");
    });
  }

  function refreshTop() {
    var scope = $("top-scope").value;
    return json("v1/top?scope=" + encodeURIComponent(scope) + "&n=20").then(function (r) {
      var body = $("top").tBodies[0];
      clear(body);
      r.top.forEach(function (e) {
        var row = document.createElement("tr");
        row.setAttribute("data-identity", e.identity);
        row.setAttribute("data-rejected", String(e.rejected));
        if (e.rejected > 0) { row.className = "over"; }
        cell(row, e.identity);
        cell(row, e.requests, "num");
        cell(row, e.rejected, "num");
        var td = cell(row, "");
        var b = document.createElement("button");
        b.type = "button";
        b.className = "usage-of";
        b.textContent = "usage";
        b.addEventListener("click", function () {
          $("usage-kind").value = scope === "key" ? "key_id" : scope;
          $("usage-value").value = e.identity;
          lookUp();
        });
        if (scope === "key" || scope === "tenant" || scope === "ip") { td.appendChild(b); }
        body.appendChild(row);
      });
    });
  }

  function refreshBlocks() {
    return json("v1/blocks").then(function (r) {
      var body = $("blocks").tBodies[0];
      clear(body);
      r.blocks.forEach(function (b) {
        var row = document.createElement("tr");
        row.setAttribute("data-id", String(b.id));
        row.setAttribute("data-value", b.value);
        cell(row, b.id, "num");
        cell(row, b.scope);
        cell(row, b.value);
        cell(row, b.reason);
        cell(row, b.expires_at || "never");
        cell(row, b.automatic ? "ban" : "block");
        var lift = document.createElement("button");
        lift.type = "button";
        lift.className = "lift";
        lift.setAttribute("data-id", String(b.id));
        lift.textContent = "lift";
        lift.addEventListener("click", function () {
          lift.disabled = true;
          api("DELETE", "v1/blocks/" + encodeURIComponent(b.id)).then(function () {
            $("blocks-error").textContent = "";
            return refreshBlocks();
          }).catch(function (e) {
            $("blocks-error").textContent = "Lifting " + b.id + " failed: " + e.message;
            lift.disabled = false;
          });
        });
        cell(row, "").appendChild(lift);
        body.appendChild(row);
      });
    });
  }

  function lookUp() {
    var kind = $("usage-kind").value;
    var value = $("usage-value").value.trim();
    var body = $("usage").tBodies[0];
    clear(body);
    $("usage-error").textContent = "";
    if (!value) { return Promise.resolve(); }
    return json("v1/usage?" + encodeURIComponent(kind) + "=" + encodeURIComponent(value)).then(function (r) {
      if (r.windows.length === 0) { $("usage-error").textContent = "No window applies."; }
      r.windows.forEach(function (w) {
        var row = document.createElement("tr");
        if (w.remaining === 0) { row.className = "over"; }
        cell(row, w.scope);
        cell(row, w.route || "");
        cell(row, w.window);
        cell(row, w.limit, "num");
        cell(row, w.used, "num");
        cell(row, w.remaining, "num");
        cell(row, new Date(w.reset * 1000).toISOString().replace(".000", ""));
        body.appendChild(row);
      });
    }).catch(function (e) {
      $("usage-error").textContent = e.status === 404 ? "No such " + kind + "." : e.message;
    });
  }

  function windows(l) {
    if (!l) { return ""; }
    var parts = l.windows.map(function (w) { return w.limit + "/" + w.window + " (" + w.algorithm + ")"; });
    if (l.concurrent) { parts.push(l.concurrent + " concurrent"); }
    return parts.join(", ");
  }

  function refreshRoutes() {
    return json("v1/routes").then(function (r) {
      var body = $("routes").tBodies[0];
      clear(body);
      r.routes.forEach(function (route) {
        var row = document.createElement("tr");
        row.setAttribute("data-route", route.name);
        cell(row, route.name);
        cell(row, (route.methods ? route.methods.join(",") + " " : "") + (route.host || "") + route.path_prefix);
        cell(row, route.auth);
        cell(row, route.mode);
        cell(row, route.cost, "num");
        cell(row, route.limits.map(function (l) { return l.scope + ": " + windows(l.limits); }).join("; "));
        body.appendChild(row);
      });
      var limits = $("limits").tBodies[0];
      clear(limits);
      var add = function (name, text) {
        if (!text) { return; }
        var row = document.createElement("tr");
        cell(row, name);
        cell(row, text);
        limits.appendChild(row);
      };
      ["global", "ip", "auth"].forEach(function (s) { add(s, windows(r.limits[s])); });
      Object.keys(r.tiers).sort().forEach(function (t) {
        add("tier " + t + " key", windows(r.tiers[t].key));
        add("tier " + t + " tenant", windows(r.tiers[t].tenant));
      });
      r.scopes.forEach(function (s) { add(s.scope, windows(s.limits)); });
    });
  }

  // ---- the loop --------------------------------------------------------------------

  function tick() {
    if (token === null) { return; }
    var gen = generation;
    var jobs = [refreshMetrics(), refreshHealth(), refreshTop(), refreshBlocks()];
    if (ticks % 12 === 0) { jobs.push(refreshRoutes()); }
    ticks += 1;
    Promise.all(jobs.map(function (p) {
      return p.catch(function (e) { return e; });
    })).then(function () {
      if (token === null || gen !== generation) { return; }
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      timer = setTimeout(tick, REFRESH_MS);
    });
  }

  function login(value) {
    generation += 1;
    token = value;
    ticks = 0;
    previous = null;
    history = { route: {}, scope: {} };
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    $("login-error").textContent = "";
    tick();
  }

  // Forgets the token and everything shown with it.
  function logout(why) {
    generation += 1;
    token = null;
    if (timer !== null) { clearTimeout(timer); timer = null; }
    previous = null;
    history = { route: {}, scope: {} };
    ["route-charts", "scope-charts"].forEach(function (id) { clear($(id)); });
    ["top", "blocks", "usage", "routes", "limits"].forEach(function (id) { clear($(id).tBodies[0]); });
    $("health").textContent = "";
    $("updated").textContent = "";
    $("app").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = why || "";
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("login").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var input = $("token");
      var value = input.value;
      input.value = "";
      if (value) { login(value); }
    });
    $("logout").addEventListener("click", function () { logout(""); });
    $("usage-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      lookUp();
    });
    $("top-scope").addEventListener("change", function () {
      refreshTop().catch(function () { /* shown on the next tick */ });
    });
  });
}());
